"""Job platforms on a mounted share: the base every cluster and cloud job platform subclasses
(Kubeflow, FrameworkController, AdaptDL today; OpenPAI, DLTS, PAI-DLC and Azure ML describe the same
local-mount / container-path model).

The share is mounted on this machine (``localMountPoint``) and in the jobs' containers (the
container path). Code bundles, the trial runtime and trial directories live on it, so a job needs no
upload of its own; see :class:`MountedShare` for the layout.

Lifecycle. ``prepare()`` checks the share, installs the trial runtime once per version, runs the
platform's own checks (:meth:`JobPlatformService.prepare_platform`) and, for
``metricChannel: http``, starts the metrics receiver (its port is kept in the experiment directory,
so a resumed controller listens where running jobs push). ``upload_code()`` extracts the code bundle
on the share once per content hash.

Without reuse, ``submit`` writes the trial directory (``parameter.cfg``, the keeper spec and one
``run_<role>.sh`` per role), stores the trial's metrics token with the platform, then starts the
job, named deterministically; platforms look the name up first, so a retried submit never creates a
second job. ``poll`` maps the job's state through the platform's table; metrics come from the
receiver (then, at the end, the job logs fill any gap), from the job logs only, or from the file on
the share. ``cancel`` deletes the job (the caller recorded the status first). A job deleted by
someone else ends its trial as SYS_CANCELED. A job the platform ended apart from its trial
(:meth:`JobPlatformService.job_interruption`: an evicted or preempted pod, a lost node) is an
interruption: the trial runs again as a new job of its own (``...r<attempt>``) in the same trial
directory, the earlier run's ``.nni/`` set aside and ``checkpoint/`` kept.

With ``reuseMode: true`` trials are queued to long-lived environments
(:mod:`.job_environments`); a trial whose environment ended or vanished is SYS_CANCELED, unless
the platform ended it under the trial (an interruption: the trial runs again in another one).
``close()`` stops and deletes the environments.

A platform implements :class:`~trialflow.platforms.job_platform_hooks.JobPlatformHooks`: the job
(start, state, delete, logs), the token's home (store, read, delete), its names and roles, and how it
tells an interruption.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from ..trial.procs import write_atomic
from ..trial.protocol import (
    KEEPER_SPEC,
    META_DIR,
    PARAMETER_FILE,
    RECEIVER_DESK,
    REPORT_DESK_ENV,
    STARTED,
    STATE,
    STDERR_FILE,
    STDOUT_FILE,
    with_stderr_tail,
)
from ..trial.records import MetricRecord
from .base import (
    CodeRef,
    ConfigT,
    LostHandleError,
    PlatformError,
    TrainingService,
    TrialHandle,
    TrialSpec,
    TrialStatus,
    TrialUpdate,
)
from .job_environments import Environment, EnvironmentPool
from .job_platform_hooks import JobPlatformHooks, stopped_run
from .metric_channel import MetricChannel
from .metrics_receiver import MetricsReceiver
from .report_desk import ReportDesk
from .runtime_files import runtime_files, runtime_key
from .trialdir import (
    LOCAL,
    answered_stop,
    read_from,
    read_json,
    read_output_files,
    read_trial,
    read_trial_logs,
    recorded_exit_code,
    set_aside_earlier_run,
    tail_text,
)

log = logging.getLogger("trialflow.platforms")
ENV_VERDICT_SECONDS = 15.0  # how long a reuse trial stopped under its environment waits for the platform's word


class JobPlatformService(JobPlatformHooks, TrainingService[ConfigT]):
    """A job platform whose jobs mount the share; subclasses implement the abstract methods."""

    reuse_supported = True
    logs_on_share = False  # True: job logs are the trial's stdout on the share (no log API used)
    other_channels = "metricChannel: file (metrics through the shared storage)"  # hint without the receiver
    asks_desk = False  # its trials ask the report desk through the metrics receiver (use_report_desk)

    def __init__(self, config: ConfigT, experiment_dir: Path) -> None:
        self.config = config
        self.experiment_dir = Path(experiment_dir)
        self.experiment_id = self.experiment_dir.name
        self.channel = getattr(config, "metric_channel", "http")
        self.metrics = MetricChannel(self.channel, config.nni_manager_ip, self.experiment_dir)
        self.reuse = config.reuse_mode and self.reuse_supported
        self.storage = self.make_storage()
        self._cancelled: dict[str, TrialStatus] = {}
        self._restarts: dict[str, str] = {}  # job -> the platform's word, while it runs the job again in place
        self._ended_by: dict[str, str] = {}  # job -> the platform's word that it ended the job apart from the trial
        self._stopped_at: dict[str, float] = {}  # reuse trial -> when its run was first seen ended by a stop
        self.environments = EnvironmentPool(self)

    @property
    def envs(self) -> dict[str, Environment]:
        """The reuse-mode environments by id."""
        return self.environments.envs

    @property
    def receiver(self) -> MetricsReceiver | None:
        """The HTTP channel's metrics receiver (None before ``prepare()`` and with other channels)."""
        return self.metrics.receiver

    @receiver.setter
    def receiver(self, receiver: MetricsReceiver | None) -> None:
        self.metrics.receiver = receiver

    def clean(self, dry_run: bool = False) -> list[str]:
        """trialflow's folders on the share (runtimes, code bundles, experiments' trial folders)."""
        return self.storage.clean(dry_run)

    def keeper_state(self, trial_id: str) -> dict[str, Any]:
        """The end the trial's keeper recorded on the shared storage (``{}`` until it has one)."""
        return read_json(LOCAL, str(self.storage.path(self.experiment_id, "trials", trial_id) / META_DIR / STATE)) or {}

    def check_receiver_reachable(self) -> None:
        """Raise ``PlatformError`` when the platform's jobs could not reach the metrics receiver."""
        self.metrics.check_reachable(self.platform_address(), self.other_channels)

    # ---- prepare and code ------------------------------------------------------------------

    def prepare(self) -> None:
        self.check_platform()
        self.storage.check()
        self.storage.claim(self.experiment_id)
        self.storage.install_runtime(runtime_key(), runtime_files())
        self.prepare_platform()
        self.metrics.start()

    @property
    def runtime_dir(self) -> str:
        return self.storage.container_path("runtime", runtime_key())

    def upload_code(self, code_dir: Path) -> CodeRef:
        digest = self.storage.install_code(code_dir, self.experiment_dir)
        return CodeRef(self.storage.container_path("code", digest), digest)

    # ---- submit ----------------------------------------------------------------------------

    def keeper_env(self, spec: TrialSpec) -> dict[str, str]:
        """NNI's trial environment as the job's keeper sets it (GPU visibility is the platform's:
        its device plugin decides, so nothing is overridden here)."""
        channel = self.metrics.keeper_value()
        return {"NNI_PLATFORM": self.platform, "NNI_EXP_ID": spec.experiment_id, "NNI_TRIAL_JOB_ID": spec.trial_id,
                "NNI_TRIAL_SEQ_ID": str(spec.sequence), "TRIALFLOW_METRIC_CHANNEL": channel, **spec.attempt_env(),
                **({REPORT_DESK_ENV: RECEIVER_DESK} if self.asks_desk else {})}

    def use_report_desk(self, desk: ReportDesk) -> bool:
        """With the HTTP metric channel, trials ask the desk through the metrics receiver (their token)."""
        if self.receiver is None:
            return False
        self.receiver.attach_desk(desk)
        self.asks_desk = True
        return True

    def _keeper_spec(self, spec: TrialSpec, code: CodeRef) -> dict[str, Any]:
        command = spec.command if self.reuse else next(iter(self.roles().values()))
        return {"command": command, "cwd": f"../../../code/{code.content_hash}", "env": self.keeper_env(spec),
                "located": True, "roles": self.roles(), "attempt": spec.attempt, "sole_primary": self.sole_primary()}

    def metrics_url(self) -> str | None:
        """Where jobs push metrics (None without the HTTP channel)."""
        return self.metrics.url

    def job_token(self, name: str, ids: dict[str, str], *trial_ids: str) -> str | None:
        """The token stored as ``name`` (created unless it exists), granted ``trial_ids``."""
        return self.metrics.token(lambda token: self.store_token(name, token, ids), *trial_ids)

    def submit(self, spec: TrialSpec, code: CodeRef) -> TrialHandle:
        trial_dir = self.storage.path(spec.experiment_id, "trials", spec.trial_id)
        self._cancelled.pop(spec.trial_id, None)  # a run after an interruption: the cancel was of the one before
        set_aside_earlier_run(LOCAL, str(trial_dir), spec.attempt)
        (trial_dir / META_DIR).mkdir(parents=True, exist_ok=True)
        write_atomic(str(trial_dir / PARAMETER_FILE), spec.parameter_record())
        keeper = self._keeper_spec(spec, code)
        write_atomic(str(trial_dir / META_DIR / KEEPER_SPEC), keeper)
        self.metrics.track(spec.trial_id)
        if self.reuse:
            return TrialHandle(spec.trial_id, self.platform, {**self.environments.submit(spec, keeper),
                                                              **self.handle_extra()})
        # each run its own job: the interrupted one may still be being deleted
        name = self.job_name("trial", self.run_ident(spec.trial_id, spec.attempt))
        primary = next(iter(self.roles()))
        commands = {}
        for role in self.roles():  # a run after an interruption: scripts of its own, knowing their run
            script = trial_dir / f"run_{role.lower()}{f'-r{spec.attempt}' if spec.attempt else ''}.sh"
            write_atomic(str(script), self.run_script(["--pod", f"trials/{spec.trial_id}", role, primary,
                                                       str(spec.attempt)], "keeper"))
            commands[role] = ["sh", self.storage.container_path(spec.experiment_id, "trials", spec.trial_id,
                                                                script.name)]
        ids = {"trialId": spec.trial_id}
        self.job_token(f"{name}-token", ids, spec.trial_id)
        self.start_job(name, ids, commands, f"{name}-token")
        return TrialHandle(spec.trial_id, self.platform, {"job": name, "reuse": False, **self.handle_extra()})

    def run_ident(self, trial_id: str, attempt: int) -> str:
        """What names run ``attempt`` of a trial in its job's name: the trial id, then ``r<attempt>``."""
        return trial_id + (f"r{attempt}" if attempt else "")

    def handle_extra(self) -> dict[str, Any]:
        """Platform fields kept in every handle (e.g. the Kubernetes namespace)."""
        return {}

    def run_script(self, args: list[str], module: str) -> str:
        """A run script that finds the runtime relative to itself (the controller and the job see the
        share at different paths)."""
        quoted = " ".join(f"\"$exp/{a}\"" if "/" in a else f"'{a}'" for a in args)
        return ("#!/bin/sh\n# written by trialflow: runs in the job's container\n"
                'here=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd)\n'
                'exp=$(CDPATH= cd -- "$here/../.." && pwd)\n'
                'nni=$(CDPATH= cd -- "$exp/.." && pwd)\n'
                f'PYTHONPATH="$nni/runtime/{os.path.basename(self.runtime_dir)}" '
                f"exec python3 -S -m trialflow.trial.{module} {quoted}\n")

    # ---- poll ------------------------------------------------------------------------------

    def _trial_dir(self, handle: TrialHandle) -> Path:
        return self.storage.path(self.experiment_id, "trials", handle.trial_id)

    def poll(self, handle: TrialHandle, cursor: dict[str, Any]) -> TrialUpdate:
        """One poll. Metrics count as delivered only once it returns: a poll that fails half-way (an
        API error) leaves them to the next one -- the cursor is not advanced, nothing is marked seen,
        and the receiver is drained only after the platform calls that can fail."""
        update = self._poll(handle, dict(cursor))
        self.metrics.delivered(handle.trial_id, update.metrics, update.status.is_terminal)
        return update

    def _poll(self, handle: TrialHandle, cursor: dict[str, Any]) -> TrialUpdate:
        if not (self._trial_dir(handle) / META_DIR).is_dir():
            raise LostHandleError(f"trial {handle.trial_id}: its directory {self._trial_dir(handle)} is missing on "
                                  "the shared storage")
        if handle.data.get("reuse"):
            return self._poll_reuse(handle, cursor)
        found = self.job_status(handle.data["job"])
        if found is None:
            status = self._cancelled.get(handle.trial_id, TrialStatus.SYS_CANCELED)
            message: str | None = (None if handle.trial_id in self._cancelled
                                   else f"job {handle.data['job']} was deleted outside trialflow")
        else:
            status, message = found
            if status == TrialStatus.SYS_CANCELED and handle.trial_id in self._cancelled:  # we stopped it
                status, message = self._cancelled[handle.trial_id], None
        state = self.keeper_state(handle.trial_id)
        ended = status.is_terminal or (found is not None and self.job_restarting(handle.data["job"], state))
        why = None
        if ended and found is not None and handle.trial_id not in self._cancelled and \
                state.get("exit_code") != 0:  # a trial that succeeded keeps its outcome
            why = self.job_interruption(handle.data["job"], state)
        # an interrupted run's results are all in its output on the share (the job's own logs may be
        # a replica's run again in place); one whose push the interruption broke off is taken from there
        records, errors = self._metrics(handle, cursor, (status.is_terminal or why is not None) and found is not None,
                                        from_share=why is not None)
        if why is not None:
            return self.interrupted(handle, why, records, cursor)
        if not status.is_terminal:
            return TrialUpdate(status, records, cursor, None, message, errors)
        return self._job_ended(handle, status, message, records, cursor, errors)

    def _job_ended(self, handle: TrialHandle, status: TrialStatus, message: str | None, records: list[MetricRecord],
                   cursor: dict[str, Any], errors: list[str]) -> TrialUpdate:
        """A non-reuse trial whose job ended: the job's status, with the keeper's exit code -- unless that
        exit answered a stop signal (:func:`~.trialdir.answered_stop`): then the end is the cancel's
        (SYS_CANCELED when the stop was not ours), with no exit code, as on every platform."""
        state = self.keeper_state(handle.trial_id)
        if answered_stop(state):
            self._finish(handle)
            return TrialUpdate(self._cancelled.get(handle.trial_id, TrialStatus.SYS_CANCELED), records, cursor, None,
                               f"exit code {state['exit_code']} after a stop signal", errors)
        exit_code = recorded_exit_code(state)
        if status == TrialStatus.FAILED:
            tail = tail_text(self._trial_dir(handle) / STDERR_FILE)
            message = with_stderr_tail((f"exit code {exit_code}; " if exit_code is not None else "") +
                                       (message or "failed"), tail)
        self._finish(handle)
        return TrialUpdate(status, records, cursor, exit_code, message, errors)

    def keeper_exit_code(self, trial_id: str) -> int | None:
        """The exit code the trial's keeper recorded on the shared storage; None until it has one."""
        return recorded_exit_code(self.keeper_state(trial_id))

    def _poll_reuse(self, handle: TrialHandle, cursor: dict[str, Any]) -> TrialUpdate:
        env = self.environments.assign(handle)
        self.environments.heartbeat()
        gone = self.environments.gone(env)  # the platform call first: it may fail, the reads below do not
        found = read_trial(LOCAL, str(self._trial_dir(handle)), 0, handle.trial_id, metrics=False)
        state, cancelled = found.state, self._cancelled.get(handle.trial_id)
        if state is not None and state.get("exit_code") != 0 and gone is None and cancelled is None:
            gone = self.environments.gone(env, force=True)  # killed with its environment: not the trial's failure
        found.records, found.errors = self._metrics(handle, cursor, state is not None or gone is not None)
        if state is not None and gone is None and cancelled is None and self._awaits_environment(handle, state):
            why = self.job_interruption(env.job, state)  # the platform may say so before the job changes
            if why is None:
                return TrialUpdate(TrialStatus.RUNNING, found.records, cursor, None, None, found.errors)
            gone = self.environments.abandon(env, f"its environment job {env.job} was stopped under the trial")
        else:
            why = None
        if state is not None and (gone is None or state.get("exit_code") == 0):
            self._finish(handle)
            return found.update(cursor, cancelled)
        if gone is not None and cancelled is None:  # the platform ended the environment under the trial?
            why = why or self.job_interruption(env.job, state or {})
            if why is not None:
                self.environments.release(handle.trial_id)
                self._stopped_at.pop(handle.trial_id, None)
                return self.interrupted(handle, f"its environment {env.id}: {why}", found.records, cursor)
        if gone is not None:
            self._finish(handle)
            return TrialUpdate(cancelled or TrialStatus.SYS_CANCELED, found.records, cursor, None,
                               f"the trial did not finish: {gone}", found.errors)
        status = TrialStatus.RUNNING if STARTED in (found.names or ()) else TrialStatus.WAITING
        return TrialUpdate(status, found.records, cursor, None, None, found.errors)

    def _awaits_environment(self, handle: TrialHandle, state: dict[str, Any]) -> bool:
        """Whether a reuse trial whose run ended by a stop (a stop signal trialflow did not send, or
        SIGKILL) waits for its environment's verdict: a platform that stops the environment under the
        trial says so only after its processes ended (a retry counted, the job queued again). It waits
        ``ENV_VERDICT_SECONDS`` at most, then ends as its run did."""
        if not state or stopped_run(state) is None:
            return False
        first = self._stopped_at.setdefault(handle.trial_id, time.monotonic())
        return time.monotonic() - first < ENV_VERDICT_SECONDS

    def _metrics(self, handle: TrialHandle, cursor: dict[str, Any], final: bool, from_share: bool = False
                 ) -> tuple[list[MetricRecord], list[str]]:
        """New metrics of the trial from its channel(s), without duplicates; ``final`` (its run ended)
        fills gaps from its output: the job's logs, or (``from_share``) the trial's stdout on the share."""
        trial_dir = self._trial_dir(handle)

        def log_chunks(offsets: dict[str, int]) -> dict[str, tuple[int, bytes]]:
            if handle.data.get("reuse") or self.logs_on_share or from_share:  # the trial's stdout file
                start = int(offsets.get(STDOUT_FILE, 0))
                return {STDOUT_FILE: (start, read_from(trial_dir / STDOUT_FILE, start))}
            return {pod: (int(offsets.get(pod, 0)), data[int(offsets.get(pod, 0)):])  # job logs come whole
                    for pod, data in self.job_logs(handle.data["job"]).items()}

        return self.metrics.read(handle.trial_id, trial_dir, cursor, final, log_chunks)

    def _finish(self, handle: TrialHandle) -> None:
        self.environments.release(handle.trial_id)
        self._stopped_at.pop(handle.trial_id, None)
        if not handle.data.get("reuse"):
            try:
                self.delete_token(f"{handle.data['job']}-token")
            except PlatformError as exc:  # the trial's result stands; the token only outlives it
                log.warning("trial %s: its metrics token %s-token was not deleted (%s) and stays with the "
                            "platform", handle.trial_id, handle.data["job"], exc)
        self.metrics.forget(handle.trial_id)

    # ---- cancel, adopt, logs, close --------------------------------------------------------

    def cancel(self, handle: TrialHandle, reason: TrialStatus) -> None:
        self._cancelled[handle.trial_id] = reason
        if not handle.data.get("reuse"):
            self.delete_job(handle.data["job"])
            self.delete_token(f"{handle.data['job']}-token")
            return
        if not self.environments.ended(str(handle.data["env"])):  # a gone one's run ended; a kill request
            # there could reach the trial's next run (the same trial directory) should its worker run again
            self.environments.files(str(handle.data["env"])).kill(handle.trial_id, f"../../trials/{handle.trial_id}")

    def adopt(self, handle: TrialHandle) -> None:
        """Re-attach after a restart: the environment is known again, and the token (read back from
        the platform) is accepted again by this controller's receiver."""
        self.metrics.track(handle.trial_id)
        if handle.data.get("reuse"):
            self.environments.assign(handle)
        if self.receiver is not None:
            self.metrics.grant(self.read_token(f"{handle.data['job']}-token"), handle.trial_id)

    output_read_seconds = 1.0  # a file read from an offset

    def read_output(self, handle: TrialHandle, offsets: dict[str, int]) -> dict[str, bytes]:
        return read_output_files(self._trial_dir(handle), offsets)

    def logs(self, handle: TrialHandle, tail: int | None = None) -> dict[str, str]:
        return read_trial_logs(self._trial_dir(handle), tail)

    def output_folder(self, handle: TrialHandle, name: str) -> Path | None:
        return self._trial_dir(handle) / name  # on the share, mounted here

    def close(self) -> None:
        """Stop and delete the reuse environments; stop the receiver. Trial jobs are left as they are."""
        self.environments.close()
        self.metrics.stop()
