"""Local training service: each trial is a real process group on this machine.

A trial runs under the trial keeper (``trialflow.trial.keeper``), forked by the service's keeper
fork server (``trialflow.trial.forkserver``: no interpreter start per trial), in its own session, with
cwd = ``trialCodeDirectory`` (NNI semantics: the code runs in place) and its own directory
``<experiment dir>/trials/<trial id>/`` (``NNI_SYS_DIR`` = ``NNI_OUTPUT_DIR``) holding
``parameter.cfg``, ``trial.stdout``, ``trial.stderr``, ``trial.log`` and ``.nni/metrics``.
Trials outlive a killed controller and are re-attached from their handle on resume. Trials that
ask for GPUs wait (WAITING) until the scheduler has free slots, then get ``CUDA_VISIBLE_DEVICES``.
Cancel sends SIGINT, then SIGTERM, then SIGKILL to the whole process group. Following a trial
waits on its keeper's pidfd, so its end is seen at once, not at the next poll.
"""

from __future__ import annotations

import logging
import os
import posixpath
import threading
import time
from pathlib import Path
from typing import Any

from ..config.sections.local import LocalConfig
from ..foundation.readable import wait_readable
from ..trial import NNI_SHIM_DIR, RUNTIME_ROOT
from ..trial.forkserver import ForkServer
from ..trial.keeper import stop_group, stop_lost_group
from ..trial.procs import pid_alive, read_json, write_atomic
from ..trial.protocol import (
    CHECKPOINT_DIR,
    CHECKPOINT_ENV,
    KEEPER_PID,
    KEEPER_SPEC,
    META_DIR,
    REPORT_DESK_ENV,
    STARTED,
    STATE,
)
from ..trial.runtime import PARAMETER_FILE
from .base import (
    CodeRef,
    LostHandleError,
    PlatformError,
    TrainingService,
    TransientPlatformError,
    TrialHandle,
    TrialSpec,
    TrialStatus,
    TrialUpdate,
)
from .errors import RetryPolicy
from .gpu import GpuError, GpuProbe, GpuScheduler
from .inherited_env import inherited_environment
from .meta_watch import MetaWatch
from .platform_row import Platform
from .report_desk import ReportDesk
from .share import OUTPUT_DIR, Share
from .trialdir import LOCAL, read_output_files, read_trial, read_trial_logs

KEEPER_PID_WAIT = 10.0
# The longest wait between polls of a running trial that has been quiet: its end (the keeper's pidfd), its
# asks at the report desk, a cancel, the experiment's stop and a change in its .nni folder (a result, its
# end: meta_watch) wake its follower at once; what it prints reaches the run's log within this, as on the
# platforms that fetch output (TrainingService.output_read_seconds).
QUIET_POLL_SECONDS = 5.0
# ... and where its .nni folder cannot be watched (no inotify, the user's watches used up): a result is
# seen within this
UNWATCHED_QUIET_SECONDS = 1.0
# the least time between a follower's polls when a change in .nni wakes it: a trial reporting many results
# a second is read five times a second, as a trial that reports is without the watch
CHANGE_WAKE_GAP = 0.2
log = logging.getLogger("trialflow.local")


def trial_env(spec: TrialSpec, platform: str, trial_dir: str, code_dir: str, gpus: list[int] | None
              ) -> dict[str, str]:
    """NNI's trial environment (docs/nni.md#trial-environment) plus the runtime on PYTHONPATH."""
    env = {
        "NNI_PLATFORM": platform, "NNI_EXP_ID": spec.experiment_id, "NNI_TRIAL_JOB_ID": spec.trial_id,
        "NNI_SYS_DIR": trial_dir, "NNI_OUTPUT_DIR": trial_dir, "NNI_CODE_DIR": code_dir,
        "NNI_TRIAL_SEQ_ID": str(spec.sequence), "TRIALFLOW_METRIC_CHANNEL": "file",
        CHECKPOINT_ENV: posixpath.join(trial_dir, CHECKPOINT_DIR), **spec.attempt_env(),
    }
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
    elif spec.gpu_number == 0:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


class LocalTrainingService(TrainingService[LocalConfig]):
    platform = "local"

    def __init__(self, config: LocalConfig, experiment_dir: Path, kill_grace_seconds: float = 2.0,
                 gpu_probe: GpuProbe | None = None) -> None:
        self.config = config
        self.experiment_dir = Path(experiment_dir)
        # with a top-level sharedStorage, trial directories live on the share (NNI's layout)
        self.share = Share(config.shared_storage, self.experiment_dir.name) if config.shared_storage else None
        self.trials_dir = self.share.local(self.experiment_dir.name, "trials") if self.share else \
            self.experiment_dir / "trials"
        self.kill_grace = kill_grace_seconds
        self._started: set[str] = set()  # keepers started by this controller
        self._pidfds: dict[str, int] = {}
        self._keepers: dict[str, tuple[int, int | None]] = {}  # (pid, start time) of each followed trial's keeper
        self._lock = threading.Lock()
        paths = [NNI_SHIM_DIR, RUNTIME_ROOT, os.environ.get("PYTHONPATH", "")]
        self._pythonpath = os.pathsep.join(p for p in paths if p)
        self._forkserver = ForkServer({**inherited_environment(), "PYTHONPATH": self._pythonpath},
                                      str(self.trials_dir.parent / "forkserver.log"))
        self._desk: ReportDesk | None = None
        self._meta_watch = MetaWatch()
        self.gpu: GpuScheduler | None = None
        if config.trial_gpu_number:
            self.gpu = GpuScheduler(gpu_probe or GpuProbe(), config.max_trial_number_per_gpu,
                                    config.gpu_indices, bool(config.use_active_gpu))

    # ---- lifecycle ----------------------------------------------------------------------

    def prepare(self) -> None:
        if self.share is not None:
            self.share.prepare_local()
        self.trials_dir.mkdir(parents=True, exist_ok=True)
        if self.gpu is not None:
            _checked(self.gpu, self.config)
        try:  # its interpreter starts while the tuner makes the first suggestion
            self._forkserver.start()
        except OSError:
            pass  # the first trial's start tries again and reports it

    def upload_code(self, code_dir: Path) -> CodeRef:
        return CodeRef(str(code_dir))  # local trials run in place (NNI semantics)

    def submit(self, spec: TrialSpec, code: CodeRef) -> TrialHandle:
        trial_dir = self.trials_dir / spec.trial_id
        (trial_dir / META_DIR).mkdir(parents=True, exist_ok=True)
        (trial_dir / PARAMETER_FILE).write_text(spec.parameter_record(), encoding="utf-8")
        handle = TrialHandle(spec.trial_id, self.platform, {
            "trial_dir": str(trial_dir), "code_dir": code.location, "command": spec.command,
            "sequence": spec.sequence, "experiment_id": spec.experiment_id, "gpu_number": spec.gpu_number,
            "parameter_id": spec.parameter_id})
        self._try_start(handle)
        return handle

    def _try_start(self, handle: TrialHandle) -> bool:
        """Start the keeper unless it already runs; False while waiting for GPUs."""
        data = handle.data
        meta = os.path.join(data["trial_dir"], META_DIR)
        with self._lock:
            if handle.trial_id in self._started or os.path.exists(os.path.join(meta, KEEPER_PID)):
                return True
            gpus = None
            if self.gpu is not None and data.get("gpu_number"):
                gpus = self.gpu.allocate(handle.trial_id, data["gpu_number"])
                if gpus is None:
                    return False
            spec = TrialSpec(data["experiment_id"], handle.trial_id, data["sequence"], data["parameter_id"], {},
                             data["command"], Path(data["code_dir"]), data.get("gpu_number"))
            env = trial_env(spec, self.platform, data["trial_dir"], data["code_dir"], gpus)
            env["PYTHONPATH"] = self._pythonpath
            if self._desk is not None and self._desk.path is not None:
                env[REPORT_DESK_ENV] = self._desk.path
            if self.share is not None:
                env["NNI_OUTPUT_DIR"] = os.path.join(data["trial_dir"], OUTPUT_DIR)
                os.makedirs(env["NNI_OUTPUT_DIR"], exist_ok=True)
            write_atomic(os.path.join(meta, KEEPER_SPEC),
                         {"command": data["command"], "cwd": data["code_dir"], "env": env, "gpus": gpus})
            try:
                self._forkserver.start_keeper(data["trial_dir"])
            except OSError as exc:
                if self.gpu is not None:
                    self.gpu.release(handle.trial_id)  # the retried submission allocates again
                raise TransientPlatformError(f"cannot start the trial's keeper: {exc}") from None
            self._started.add(handle.trial_id)
        self._keeper(handle)  # known from now on, so a trial whose directory goes can still be stopped
        return True

    def _keeper(self, handle: TrialHandle) -> tuple[int, int | None] | None:
        """(pid, start time) of the trial's keeper once it was started, remembered once read: a keeper
        writes its ``keeper.pid`` once, and the trial's later polls look no more at the file (it goes
        with the trial's directory). A keeper started by a request whose reply was lost writes its own
        ``keeper.pid`` at once, so it is waited for."""
        known = self._keepers.get(handle.trial_id)
        if known is not None:
            return known
        meta = os.path.join(handle.data["trial_dir"], META_DIR)
        path = os.path.join(meta, KEEPER_PID)
        info = read_json(path)
        deadline = time.monotonic() + KEEPER_PID_WAIT
        while (info is None and handle.trial_id in self._started and time.monotonic() < deadline
               and os.path.isdir(meta)):  # a removed trial directory never gets one
            time.sleep(0.02)
            info = read_json(path)
        if info is None:
            return None
        keeper = self._keepers[handle.trial_id] = (int(info["pid"]), info.get("start_time"))
        return keeper

    def poll(self, handle: TrialHandle, cursor: dict[str, Any]) -> TrialUpdate:
        """The trial's status and new metrics. Raises LostHandleError when its directory is gone
        (before or while it is read: a missing keeper or exit code is then no evidence of a kill)."""
        trial_dir = self._existing_dir(handle)
        offset = int(cursor.get("metrics_offset", 0))
        if not self._try_start(handle):
            return TrialUpdate(TrialStatus.WAITING, cursor={"metrics_offset": offset})
        found = read_trial(LOCAL, trial_dir, offset, handle.trial_id)
        records, errors, new_cursor = found.records, found.errors, {"metrics_offset": found.offset}
        if found.state is not None:
            self._finish(handle)
            return found.update(new_cursor)
        meta = os.path.join(trial_dir, META_DIR)
        keeper = self._keeper(handle)
        # the keeper's end is looked at before its exit code: it writes the code, then exits, so a code
        # still absent after its end was never written (read first, it may have come just after the read)
        ended = keeper is not None and not pid_alive(*keeper)
        state = read_json(os.path.join(meta, STATE)) if ended else None  # a live keeper's is read next time
        self._existing_dir(handle)  # removed while read: absent files prove no kill
        if ended and state is None:
            self._finish(handle)
            return TrialUpdate(TrialStatus.SYS_CANCELED, records, new_cursor, None,
                               "the trial's process group ended without recording an exit code (killed)", errors)
        if keeper is None and handle.trial_id in self._started:
            self._finish(handle)
            return TrialUpdate(TrialStatus.SYS_CANCELED, records, new_cursor, None,
                               "the trial's keeper never started", errors)
        started = STARTED in (found.names or ())
        return TrialUpdate(TrialStatus.RUNNING if started else TrialStatus.WAITING, records, new_cursor, None, None,
                           errors)

    def _existing_dir(self, handle: TrialHandle) -> str:
        """The trial's directory. Raises LostHandleError when its metadata folder (which ``rmtree``
        takes first) no longer exists, once the trial's process group is stopped (where its keeper was
        seen and still runs) and its GPUs released: nothing of a trial no one can follow goes on
        running, or keeps GPUs the next trials wait for."""
        trial_dir = handle.data.get("trial_dir")
        if trial_dir and os.path.isdir(os.path.join(trial_dir, META_DIR)):
            return str(trial_dir)
        keeper = self._keepers.get(handle.trial_id)
        running = keeper is not None and stop_lost_group(*keeper, self.kill_grace)
        self._finish(handle)
        raise LostHandleError(f"trial {handle.trial_id}: its directory {trial_dir} no longer exists"
                              + ("; its processes were stopped" if running else ""))

    def _finish(self, handle: TrialHandle) -> None:
        self._started.discard(handle.trial_id)
        self._keepers.pop(handle.trial_id, None)
        fd = self._pidfds.pop(handle.trial_id, None)
        if fd is not None:
            os.close(fd)
        if trial_dir := handle.data.get("trial_dir"):
            self._meta_watch.forget(os.path.join(trial_dir, META_DIR))
        if self.gpu is not None:
            self.gpu.release(handle.trial_id)

    quiet_poll_seconds = QUIET_POLL_SECONDS

    def wait(self, handle: TrialHandle, timeout: float) -> None:
        """Sleep up to ``timeout``, waking as soon as the trial's keeper exits (a pidfd) or the trial
        asks the report desk (:meth:`use_report_desk`)."""
        self.wait_or_woken(handle, timeout, None)

    def wait_or_woken(self, handle: TrialHandle, timeout: float, wakeup_fd: int | None) -> None:
        """As :meth:`wait`, waking also once ``wakeup_fd`` is readable (the follower's cancel or stop),
        and once the trial's ``.nni`` folder changes (:mod:`.meta_watch`; at most every
        :data:`CHANGE_WAKE_GAP`). Where that folder is not watched, it waits up to
        :data:`UNWATCHED_QUIET_SECONDS`. The first wait that watches it returns at once: a change made
        before the watch began is read by the next poll."""
        changed = None
        if wakeup_fd is not None:
            meta = os.path.join(handle.data["trial_dir"], META_DIR)
            watched = self._meta_watch.watch(meta)
            if watched is None:
                timeout = min(timeout, UNWATCHED_QUIET_SECONDS)
            else:
                changed, new = watched
                if new:  # watched from now on
                    self._meta_watch.clear(meta)
                    return
        fd = self._pidfds.get(handle.trial_id)
        if fd is None:
            keeper = self._keeper(handle)
            if keeper is not None and pid_alive(*keeper):
                try:
                    fd = self._pidfds[handle.trial_id] = os.pidfd_open(keeper[0])
                except (AttributeError, OSError):  # no pidfds here, or the keeper just ended
                    fd = None
        asked = self._desk.wakeup_fd(handle.trial_id) if self._desk is not None else None
        urgent = [f for f in (fd, asked, wakeup_fd) if f is not None]
        if not urgent and changed is None:
            time.sleep(timeout)
            return
        began = time.monotonic()
        ready = wait_readable(urgent if changed is None else [*urgent, changed], timeout)  # closed: ready
        if ready == [changed] and (rest := CHANGE_WAKE_GAP - (time.monotonic() - began)) > 0:
            if urgent:
                wait_readable(urgent, rest)
            else:
                time.sleep(rest)
        if changed is not None:  # nothing once the trial's end forgot the folder
            self._meta_watch.clear(meta)
        if asked is not None and self._desk is not None:
            self._desk.clear_wakeup(handle.trial_id)

    def use_report_desk(self, desk: ReportDesk) -> bool:
        """Local trials reach the controller's desk on this machine, at its Unix socket; False (logged:
        the assessor then judges at each poll) when no socket can be made here."""
        try:
            desk.listen()
        except OSError as exc:
            log.warning("the assessor judges trials when they are polled, not as they report: no report desk (%s)",
                        exc)
            return False
        self._desk = desk
        return True

    def cancel(self, handle: TrialHandle, reason: TrialStatus) -> None:
        keeper = self._keeper(handle)
        if keeper is not None and pid_alive(*keeper):
            stop_group(os.path.join(handle.data["trial_dir"], META_DIR), keeper[0], self.kill_grace)
        self._finish(handle)

    def adopt(self, handle: TrialHandle) -> None:
        """Re-attach a trial started by an earlier controller (resume): re-register its GPUs."""
        keeper = read_json(os.path.join(handle.data["trial_dir"], META_DIR, KEEPER_SPEC))
        if self.gpu is not None and keeper and keeper.get("gpus"):
            self.gpu.adopt(handle.trial_id, keeper["gpus"])

    output_read_seconds = 1.0  # a file read from an offset

    def read_output(self, handle: TrialHandle, offsets: dict[str, int]) -> dict[str, bytes]:
        return read_output_files(handle.data["trial_dir"], offsets)

    def logs(self, handle: TrialHandle, tail: int | None = None) -> dict[str, str]:
        return read_trial_logs(handle.data["trial_dir"], tail)

    def output_folder(self, handle: TrialHandle, name: str) -> Path | None:
        output = Path(handle.data["trial_dir"])
        return (output / OUTPUT_DIR if self.share is not None else output) / name

    def close(self) -> None:
        self._forkserver.close()
        self._meta_watch.close()
        for fd in self._pidfds.values():
            os.close(fd)
        self._pidfds.clear()


def check_gpus(config: LocalConfig) -> None:
    """What ``create`` checks of a local section before anything is written: the GPUs its trials ask
    for (``trialGpuNumber``) are visible on this machine. Raises :class:`PlatformError` naming the
    setting to change."""
    if config.trial_gpu_number:
        _checked(GpuScheduler(GpuProbe(), config.max_trial_number_per_gpu, config.gpu_indices,
                              bool(config.use_active_gpu)), config)


def _checked(gpu: GpuScheduler, config: LocalConfig) -> None:
    try:
        gpu.check(config.trial_gpu_number or 0)
    except GpuError as exc:
        raise PlatformError(str(exc)) from None


PLATFORM = Platform(LocalConfig, LocalTrainingService, retry=RetryPolicy(retries=3, delay=0.2))
