"""Remote training service: trials run on the machines of ``machineList``, reached over SSH.

Lifecycle. ``prepare()`` logs in to every machine (host keys checked, credentials from the config
or a Prefect block), finds Python (``pythonPath`` first), uploads the trial runtime (keeper, worker,
``nni`` package; standard library only) once per version, and checks the runtime's version against
the controller's (major.minor). ``upload_code()`` sends the code bundle to each machine that does
not have its content hash yet. Trials are placed on the machine with free GPU slots (remote
``nvidia-smi``) or, without GPUs, the least busy one.

Layout on a machine, under ``remoteWorkingDirectory``::

    runtime/<version>-<hash>/   trial runtime (on PYTHONPATH of keepers and trials)
    code/<content hash>/        extracted code bundle; trials run with it as cwd (NNI semantics)
    <experiment>/trials/<id>/   parameter.cfg, trial.stdout, trial.stderr, .nni/{metrics,state,...}
    <experiment>/env-<n>/       reuse mode: the worker's queue, heartbeat and stop files

Without reuse, ``submit`` is one SSH command that writes the trial directory and forks a keeper
into its own session. With ``reuseMode: true`` a long-lived worker per machine takes trials from a
queue written over SFTP -- no SSH command per trial. Either way the trial survives a dropped
connection or a killed controller; ``poll`` reads its files incrementally over SFTP and a resumed
controller re-attaches through the stored handle. ``cancel`` stops the trial's process group
(SIGINT, SIGTERM, SIGKILL); a trial that never started is prevented from starting.
"""

from __future__ import annotations

import json
import logging
import posixpath
import shlex
import threading
import time
from pathlib import Path
from typing import Any

from .. import __version__
from ..blocks import SSHCredentials
from ..config.sections.remote import RemoteConfig
from ..trial.keeper import assign_gpus
from ..trial.procs import stat_alive, stat_fields
from ..trial.protocol import (
    HEARTBEAT_SECONDS,
    HOLD,
    KEEPER_LOCK,
    KEEPER_PID,
    KEEPER_SPEC,
    LOG_FILES,
    META_DIR,
    QUEUE,
    STARTED,
    STATE,
    TAKEN,
    WORKER_IDLE_TIMEOUT,
)
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
from .gpu import GpuError
from .local import trial_env
from .ownership import claim
from .platform_row import Platform
from .remote_machine import Placements, RemoteMachine, clean_machines, machine_key
from .runtime_files import check_version
from .share import MOUNT_CONFIG, OUTPUT_DIR, Share
from .ssh import SshConnection, machine_target
from .trialdir import (
    EnvironmentDir,
    install_code,
    keeper_identity,
    read_json,
    read_trial,
    read_trial_logs,
    scan_bundle,
    set_aside_earlier_run,
)

log = logging.getLogger("trialflow.platforms")
LIVENESS_SECONDS = 3.0
FIRST_WAIT_SECONDS = 0.02  # waits between polls start here and double up to the flow's poll interval
_q = shlex.quote


class RemoteTrainingService(TrainingService[RemoteConfig]):
    platform = "remote"

    def __init__(self, config: RemoteConfig, experiment_dir: Path, kill_grace_seconds: float = 2.0,
                 worker_idle_timeout: float = WORKER_IDLE_TIMEOUT) -> None:
        self.config = config
        self.experiment_dir = Path(experiment_dir)
        self.experiment_id = self.experiment_dir.name
        self.kill_grace = kill_grace_seconds
        self.worker_idle_timeout = worker_idle_timeout
        self.reuse = bool(config.reuse_mode)
        self.machines: list[RemoteMachine] = []
        self._lock = threading.Lock()
        self._liveness: dict[str, float] = {}
        # (pid, start time) of each trial's keeper, as its start told or its keeper.pid said when last read
        self._keepers: dict[str, tuple[int, int | None]] = {}
        self._waits: dict[str, int] = {}
        self.uploaded_bytes = 0  # code bundle bytes sent over SSH by this service object
        self.share = Share(config.shared_storage, self.experiment_id) if config.shared_storage else None
        for index, machine in enumerate(config.machine_list):
            remote = RemoteMachine(index, machine, SshConnection(machine_target(machine), config.known_hosts_file,
                                                                  config.trust_unknown_hosts), machine_key(machine))
            self.machines.append(remote)
        self.placements = Placements(self.machines, self.experiment_dir / "placements")

    # ---- prepare ----------------------------------------------------------------------------

    def prepare(self) -> None:
        if self.share is not None:
            self.share.prepare_local()
        errors: list[PlatformError] = []
        threads = [threading.Thread(target=self._prepare_machine, args=(m, errors)) for m in self.machines]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if len(errors) == 1:
            raise errors[0]
        if errors:
            raise PlatformError("; ".join(map(str, errors)))
        gpu_number = self.config.trial_gpu_number or 0
        if gpu_number:
            problems = []
            for machine in self.machines:
                try:
                    machine.gpu.check(gpu_number)  # type: ignore[union-attr]
                except GpuError as exc:
                    problems.append(f"{machine.key}: {exc}")
                    machine.gpu = None
            if len(problems) == len(self.machines):
                raise PlatformError(f"no machine can run a trial with trialGpuNumber {gpu_number}: "
                                    + "; ".join(problems))

    def _prepare_machine(self, machine: RemoteMachine, errors: list[PlatformError]) -> None:
        try:
            machine.probe()
            # with a shared storage the code is on the share: nothing goes to the machine's code folder
            claim(machine.fs, machine.root, self.experiment_id, ("runtime",) if self.share else ("code", "runtime"))
            machine.install_runtime()
            check_version(machine.run(machine.command("keeper", "--version")).strip(),
                          f"the trial keeper on {machine.key}",
                          f"remove {machine.runtime} on that machine so that this controller uploads its own",
                          __version__)
            if self.share is not None:
                self.share.attach(machine.fs, machine.conn.run, machine.root)
            if self.config.trial_gpu_number:
                machine.use_gpus()
            if self.reuse:
                self._start_worker(machine)
        except TransientPlatformError as exc:
            errors.append(PlatformError(f"{exc} -- check host, port and that sshd runs there"))
        except PlatformError as exc:
            errors.append(exc)

    # ---- reuse-mode worker ------------------------------------------------------------------

    def _env_dir(self, machine: RemoteMachine) -> str:
        return posixpath.join(machine.root, self.experiment_id, f"env-{machine.index}")

    def _env(self, machine: RemoteMachine) -> EnvironmentDir:
        return EnvironmentDir(machine.fs, self._env_dir(machine))

    def _start_worker(self, machine: RemoteMachine) -> None:
        env_dir = self._env_dir(machine)
        machine.run(machine.command("worker", env_dir, str(self.worker_idle_timeout)))
        self._heartbeat(machine, force=True)
        deadline = time.monotonic() + 15.0
        while True:
            info = self._env(machine).worker_info()
            if info is not None:
                check_version(str(info.get("version")), f"the reuse worker on {machine.key}",
                              f"stop it (create {env_dir}/stop on that machine) or resume with the trialflow "
                              "version that started it", __version__)
                return
            if time.monotonic() > deadline:
                raise PlatformError(f"{machine.key}: the reuse worker did not start; see {env_dir}/worker.log")
            time.sleep(0.05)

    def _heartbeat(self, machine: RemoteMachine, force: bool = False) -> None:
        if not self.reuse or (not force and time.monotonic() - machine.last_heartbeat < HEARTBEAT_SECONDS):
            return
        machine.last_heartbeat = time.monotonic()
        self._env(machine).heartbeat()

    # ---- code -------------------------------------------------------------------------------

    def upload_code(self, code_dir: Path) -> CodeRef:
        if self.share is not None:  # extracted once on the share: every machine sees it, nothing is sent
            return CodeRef(str(code_dir), self.share.install_code(code_dir, self.experiment_dir))
        bundle, digest = scan_bundle(code_dir, self.experiment_dir)
        for machine in self.machines:
            self.uploaded_bytes += install_code(machine.fs, posixpath.join(machine.root, "code", digest), digest,
                                                bundle.stream)
        return CodeRef(str(bundle.root), digest)

    # ---- trials -----------------------------------------------------------------------------

    def _machine(self, handle: TrialHandle) -> RemoteMachine:
        """The machine a handle points to, logged in and with the runtime, also without ``prepare()``
        (the CLI cancels and fetches logs of trials whose controller is gone)."""
        machine = self.placements.by_key.get(str(handle.data.get("machine")))
        if machine is None:
            raise LostHandleError(f"trial {handle.trial_id}: machine {handle.data.get('machine')!r} is no longer in "
                                  "machineList")
        if not machine.runtime:
            with self._lock:
                if not machine.runtime:
                    machine.probe()
                    machine.install_runtime()
        return machine

    def submit(self, spec: TrialSpec, code: CodeRef) -> TrialHandle:
        gpu_number = spec.gpu_number or 0
        machine = self.placements.place(spec.trial_id, gpu_number)
        if self.share is None:
            trial_dir = posixpath.join(machine.root, spec.experiment_id, "trials", spec.trial_id)
            code_dir = posixpath.join(machine.root, "code", str(code.content_hash))
        else:
            trial_dir = self.share.remote(machine.root, spec.experiment_id, "trials", spec.trial_id)
            code_dir = self.share.remote(machine.root, "code", str(code.content_hash))
        gpus = machine.gpu.allocate(spec.trial_id, gpu_number) if machine.gpu is not None and gpu_number else None
        env = trial_env(spec, self.platform, trial_dir, code_dir, gpus)
        if self.share is not None:  # NNI's layout on a share: the trial's output in nnioutput/
            env["NNI_OUTPUT_DIR"] = posixpath.join(trial_dir, OUTPUT_DIR)
            (self.share.trial_dir(spec.trial_id) / OUTPUT_DIR).mkdir(parents=True, exist_ok=True)
        env["PYTHONPATH"] = f"{posixpath.join(machine.runtime, 'trialflow', 'trial', 'nni_shim')}:{machine.runtime}"
        env["PATH"] = machine.path_env
        hold = bool(gpu_number) and gpus is None
        payload = {"trial_dir": trial_dir, "parameter": spec.parameter_record(), "hold": hold,
                   "keeper": {"command": spec.command, "cwd": code_dir, "env": env, "gpus": gpus,
                              "attempt": spec.attempt}}
        set_aside_earlier_run(machine.fs, trial_dir, spec.attempt)  # the same machine: its checkpoint is there
        handle = TrialHandle(spec.trial_id, self.platform, {
            "machine": machine.key, "trial_dir": trial_dir, "reuse": self.reuse, "gpu_number": gpu_number})
        with self._lock:
            machine.active.add(spec.trial_id)
        if self.reuse:
            self._env(machine).enqueue(spec.trial_id, payload, HOLD if hold else QUEUE)
            self._heartbeat(machine)
        else:
            self._note_keeper(handle, machine.run(machine.command("keeper", "--submit"), json.dumps(payload).encode()))
        return handle

    def _note_keeper(self, handle: TrialHandle, output: str) -> None:
        """Remember the keeper a ``--submit`` or ``--detach`` says it started (its last line: the keeper's
        process record), so the trial can be stopped even when its directory goes before the first poll
        reads ``keeper.pid``."""
        try:
            keeper = keeper_identity(json.loads(output.strip().splitlines()[-1]))
        except (IndexError, ValueError):
            return  # held for GPUs: no keeper yet, nothing printed
        if keeper is not None:
            self._keepers.setdefault(handle.trial_id, keeper)

    def _start_held(self, machine: RemoteMachine, handle: TrialHandle) -> bool:
        """Start a trial that waits for GPU slots once the machine has them; False while waiting."""
        if machine.gpu is None:
            return True
        gpus = machine.gpu.allocate(handle.trial_id, int(handle.data.get("gpu_number") or 0))
        if gpus is None:
            return False
        indices = ",".join(map(str, gpus))
        if not handle.data.get("reuse"):
            self._note_keeper(handle, machine.run(machine.command("keeper", "--detach", handle.data["trial_dir"],
                                                                  indices)))
            return True
        def release(payload: dict[str, Any]) -> None:
            payload["hold"] = False
            assign_gpus(payload["keeper"], gpus)

        self._env(machine).release(handle.trial_id, release)
        return True

    def poll(self, handle: TrialHandle, cursor: dict[str, Any]) -> TrialUpdate:
        machine = self._machine(handle)
        self._heartbeat(machine)
        trial_dir = handle.data["trial_dir"]
        meta = posixpath.join(trial_dir, META_DIR)
        found = read_trial(machine.fs, trial_dir, int(cursor.get("metrics_offset", 0)), handle.trial_id)
        new_cursor = {"metrics_offset": found.offset}
        names, records, errors = found.names or set(), found.records, found.errors
        if not names:
            if self._queued(machine, handle):
                return TrialUpdate(TrialStatus.WAITING, cursor=new_cursor)
            stopped = self._stop_lost(machine, handle)
            self._finish(machine, handle)  # its slot and GPUs go to the next trials
            raise LostHandleError(f"trial {handle.trial_id}: its directory {trial_dir} no longer exists on "
                                  f"{machine.key}" + ("; its processes were stopped" if stopped else ""))
        if found.state is not None:
            self._finish(machine, handle)
            return found.update(new_cursor)
        if KEEPER_LOCK not in names:  # written but held for GPU slots (non-reuse)
            self._start_held(machine, handle)
            return TrialUpdate(TrialStatus.WAITING, records, new_cursor, None, None, errors)
        if KEEPER_PID in names and not self._keeper_alive(machine, handle, meta):
            return self._vanished(machine, handle, new_cursor, records, errors)
        status = TrialStatus.RUNNING if STARTED in names else TrialStatus.WAITING
        return TrialUpdate(status, records, new_cursor, None, None, errors)

    def _queued(self, machine: RemoteMachine, handle: TrialHandle) -> bool:
        """Reuse mode: the trial is still in the worker's queue (or held for GPUs), or taken by the worker
        that has not yet started its keeper (and may not have written its files). Once that keeper
        started, the trial is not queued: a trial without files is then lost, and that keeper is the
        one to stop."""
        if not handle.data.get("reuse"):
            return False
        env = self._env(machine)
        found = env.boxes_holding(handle.trial_id)
        if HOLD in found:
            self._start_held(machine, handle)
        if found == {TAKEN}:
            keeper = env.started_keeper(handle.trial_id)
            # the note is written after the trial's files: files absent after it was read were removed
            # (absent before it was read, they may just not have been written yet)
            if keeper is not None and not machine.fs.exists(posixpath.join(handle.data["trial_dir"], META_DIR)):
                self._keepers.setdefault(handle.trial_id, keeper)
                return False
        return bool(found)

    def _keeper_alive(self, machine: RemoteMachine, handle: TrialHandle, meta: str) -> bool:
        """Checked every few seconds: is the keeper's process (pid and start time) still there?"""
        now = time.monotonic()
        if now - self._liveness.get(handle.trial_id, 0.0) < LIVENESS_SECONDS:
            return True
        self._liveness[handle.trial_id] = now

        info = read_json(machine.fs, posixpath.join(meta, KEEPER_PID))
        if not info:
            return True
        pid, start = self._keepers[handle.trial_id] = (int(info["pid"]), info.get("start_time"))
        line = machine.fs.read(f"/proc/{pid}/stat", 0, 4096)
        if line is None:
            return not machine.fs.exists("/proc/self")  # no /proc at all: cannot tell, assume alive
        return stat_alive(stat_fields(line.decode("ascii", "replace")), start)

    def _stop_lost(self, machine: RemoteMachine, handle: TrialHandle) -> bool:
        """Stop the process group of a trial whose directory is gone, where its keeper was seen (its
        ``keeper.pid`` went with the directory) and still runs there. True when it was stopped; a command
        that fails is logged, and the trial is lost all the same. Raises TransientPlatformError when the
        machine cannot be reached (the poll is tried again)."""
        keeper = self._keepers.get(handle.trial_id)
        if keeper is None:
            return False
        pid, start = keeper
        if start is None:
            return False  # no start time to check the pid by: it may belong to another process now
        command = machine.command("keeper", "--stop-group", str(pid), str(start), str(self.kill_grace))
        try:
            return machine.run(command, timeout=30 + 4 * self.kill_grace).strip() == "stopped"
        except TransientPlatformError:
            raise
        except PlatformError as exc:
            log.warning("trial %s: its processes on %s could not be stopped: %s", handle.trial_id, machine.key, exc)
            return False

    def _vanished(self, machine: RemoteMachine, handle: TrialHandle, cursor: dict[str, Any], records: list[Any],
                  errors: list[str]) -> TrialUpdate:
        """The keeper is gone: unless it recorded an end after all, the trial's run was lost with it (the
        machine restarted, or its processes were killed): an interruption."""
        state_path = posixpath.join(handle.data["trial_dir"], META_DIR, STATE)
        if machine.fs.exists(state_path):
            return TrialUpdate(TrialStatus.RUNNING, records, cursor, None, None, errors)  # next poll reads it
        self._finish(machine, handle)
        return self.interrupted(handle, f"the trial's keeper on {machine.key} ended without recording an exit "
                                        "code (the machine restarted, or its processes were killed)", records, cursor)

    def wait(self, handle: TrialHandle, timeout: float) -> None:
        """Sleep between polls: short at first (a short trial ends sooner than one poll interval),
        doubling up to ``timeout``, so long trials cost one SFTP listing per interval."""
        count = self._waits.get(handle.trial_id, 0)
        self._waits[handle.trial_id] = count + 1
        time.sleep(min(timeout, FIRST_WAIT_SECONDS * 2 ** min(count, 16)))

    def _finish(self, machine: RemoteMachine, handle: TrialHandle) -> None:
        with self._lock:
            machine.active.discard(handle.trial_id)
        self.placements.forget(handle.trial_id)
        self._liveness.pop(handle.trial_id, None)
        self._keepers.pop(handle.trial_id, None)
        self._waits.pop(handle.trial_id, None)
        if machine.gpu is not None:
            machine.gpu.release(handle.trial_id)

    def cancel(self, handle: TrialHandle, reason: TrialStatus) -> None:
        machine = self._machine(handle)
        if handle.data.get("reuse"):
            self._env(machine).dequeue(handle.trial_id)
        machine.run(machine.command("keeper", "--kill", handle.data["trial_dir"], str(self.kill_grace)),
                    timeout=30 + 3 * self.kill_grace)
        self._finish(machine, handle)

    def adopt(self, handle: TrialHandle) -> None:
        """Re-attach a trial started by an earlier controller: count it and re-register its GPUs."""
        machine = self._machine(handle)
        with self._lock:
            machine.active.add(handle.trial_id)
        if machine.gpu is not None:
            keeper = read_json(machine.fs, posixpath.join(handle.data["trial_dir"], META_DIR, KEEPER_SPEC)) or {}
            if keeper.get("gpus"):
                machine.gpu.adopt(handle.trial_id, keeper["gpus"])

    def logs(self, handle: TrialHandle, tail: int | None = None) -> dict[str, str]:
        """Fetch the trial's logs over SFTP; copies land in the local trial directory too."""
        machine = self._machine(handle)
        local_dir = self.experiment_dir / "trials" / handle.trial_id
        local_dir.mkdir(parents=True, exist_ok=True)
        for name in LOG_FILES:
            machine.fs.download(posixpath.join(handle.data["trial_dir"], name), local_dir / name)
        return read_trial_logs(local_dir, tail)

    def output_folder(self, handle: TrialHandle, name: str) -> Path | None:
        """Copy the remote ``<trial dir>/<name>`` tree over SFTP into the local trial directory (a
        snapshot: files written later need another call); symbolic links are not followed. With a
        shared storage: the folder on the share, read in place."""
        if self.share is not None:
            return self.share.trial_dir(handle.trial_id) / OUTPUT_DIR / name
        machine = self._machine(handle)
        target = self.experiment_dir / "trials" / handle.trial_id / name
        machine.fs.download(posixpath.join(handle.data["trial_dir"], name), target)
        return target

    def clean(self, dry_run: bool = False) -> list[str]:
        """On each machine, trialflow's marked folders under its ``remoteWorkingDirectory`` (the code
        bundles, the runtimes, every experiment's folder; see :mod:`~trialflow.platforms.ownership`)
        and the share's mount configs it wrote there; nothing else is touched, no link followed. The
        folder itself goes when that leaves it empty. Raises :class:`PlatformError` for a working
        directory that is ``/`` or a home folder: it is not trialflow's to clean."""
        return clean_machines(self.machines, dry_run, MOUNT_CONFIG)

    def close(self) -> None:
        """Ask reuse workers to leave and close the connections; running trials are not touched."""
        for machine in self.machines:
            if self.reuse and machine.root:
                try:
                    self._env(machine).stop()
                except PlatformError as exc:  # the worker still leaves when its heartbeat stops
                    log.warning("the reuse worker on %s was not asked to stop (%s); it leaves after %.0f s without "
                                "a heartbeat", machine.key, exc, self.worker_idle_timeout)
            machine.conn.close()


PLATFORM = Platform(RemoteConfig, RemoteTrainingService, SSHCredentials)
