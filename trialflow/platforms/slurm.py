"""Slurm: each trial is a batch job on a Slurm cluster; with ``reuseMode: true`` long-running jobs
(environments) host trial after trial through the reuse worker.

Reaching the cluster. Without ``host`` this machine is a login node: ``sbatch``, ``squeue`` and
``scancel`` run here and the files are local. With ``host`` the controller logs in to a login node
over SSH with the remote platform's machinery (host keys checked, credentials inline or from an
``SSHCredentials`` block, files over SFTP). ``loginCommand`` (``module load slurm``) runs before
each Slurm command there. Slurm's own CLIs are called (:mod:`.slurm_scheduler`; submitit pickles Python
functions and calls ``sbatch`` only on the machine it runs on: it fits neither shell trial commands nor
the SSH route).

Files live under ``remoteWorkingDirectory`` on the cluster's shared filesystem, laid out as on a
remote machine (``runtime/``, ``code/<hash>/``, ``<experiment>/trials/<id>/``,
``<experiment>/envs/<id>/``); compute nodes must see that folder at the same path.

Lifecycle. ``prepare()`` logs in, finds Python, installs the trial runtime once per version and
asks Slurm for its partitions (a cluster that does not answer fails here with a hint).
``upload_code()`` extracts the code bundle once per content hash. ``submit`` writes the trial
directory, then its batch script, then calls ``sbatch`` for a job named ``tf-<experiment>-<trial>``
(``-r<n>`` for the n-th resubmission): a retried submit finds the job by that name first, and the
job's keeper (``keeper --batch``, the trial protocol's claim) claims the trial before running it, so a
requeued job never runs a trial twice. ``poll`` reads Slurm's view of every job of the experiment
(one ``squeue`` per second, taken before the trial's files are read) and the trial's files;
``cancel`` is ``scancel``, after ``stop_sent`` is written for a running trial (Slurm signals its
keeper and the trial at once; the mark makes any exit but 0 read as the stop's); reuse: a kill
request to the environment's worker. ``close()`` stops the idle environments and cancels those of
cancelled trials; running trials are not touched.

State table: Slurm's job state, with the trial's own record (its keeper's exit code):

============================================  ==================================================
Slurm job state                               trial
============================================  ==================================================
PENDING, CONFIGURING, REQUEUE_HOLD            WAITING
RUNNING, COMPLETING, SUSPENDED, STOPPED       RUNNING once the trial started, else WAITING; a
                                              trial killed by a signal waits for Slurm's verdict
COMPLETED, or gone from ``squeue``            the trial's record: SUCCEEDED on exit 0, else FAILED
FAILED, OUT_OF_MEMORY, BOOT_FAIL, DEADLINE    FAILED with Slurm's state and reason
TIMEOUT                                       FAILED: the job reached its time limit
CANCELLED                                     the stop trialflow asked for, else SYS_CANCELED
PREEMPTED, NODE_FAIL, REQUEUED, a restart     interrupted: resubmitted with the same parameters
============================================  ==================================================

A record of exit 0 always wins. A job gone from ``squeue`` (after ``MinJobAge``) with no record
ends SYS_CANCELED.
"""

from __future__ import annotations

import json
import logging
import posixpath
import shlex
import shutil
import threading
from pathlib import Path
from typing import Any

from .. import __version__
from ..blocks import SSHCredentials
from ..config.sections.slurm import SlurmConfig
from ..trial.protocol import (
    LOG_FILES,
    META_DIR,
    OUTPUT_FILES,
    STARTED,
    STDERR_FILE,
    WORKER_IDLE_TIMEOUT,
    with_stderr_tail,
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
from .job_environments import Environment, EnvironmentTable
from .local import trial_env
from .ownership import claim
from .platform_row import Platform
from .remote_machine import RemoteMachine, clean_machines
from .runtime_files import check_version
from .slurm_scheduler import SlurmJob, SlurmScheduler
from .trialdir import (
    EnvironmentDir,
    install_code,
    read_trial,
    read_trial_logs,
    scan_bundle,
    set_aside_earlier_run,
    tail_text,
)
from .trialfs import LocalFS

log = logging.getLogger("trialflow.platforms")
_q = shlex.quote
WAITING_STATES = {"PENDING", "CONFIGURING", "REQUEUE_HOLD", "RESV_DEL_HOLD", "SPECIAL_EXIT"}
RUNNING_STATES = {"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESIZING"}
INTERRUPTED_STATES = {"PREEMPTED", "NODE_FAIL", "REQUEUED", "REQUEUE_FED"}
FAILED_STATES = {"FAILED", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "TIMEOUT"}


class SlurmEnvironments(EnvironmentTable):
    """The reuse-mode jobs of one Slurm service, each running the worker (one trial at a time) in its
    folder under the experiment's ``envs/`` on the cluster."""

    def __init__(self, service: SlurmTrainingService) -> None:
        super().__init__()
        self.service = service

    def files(self, env_id: str) -> EnvironmentDir:
        login = self.service.login
        return EnvironmentDir(login.fs, posixpath.join(login.root, self.service.experiment_id, "envs", env_id))


class SlurmTrainingService(TrainingService[SlurmConfig]):
    platform = "slurm"

    def __init__(self, config: SlurmConfig, experiment_dir: Path,
                 worker_idle_timeout: float = WORKER_IDLE_TIMEOUT) -> None:
        self.config = config
        self.experiment_dir = Path(experiment_dir)
        self.experiment_id = self.experiment_dir.name
        self.reuse = bool(config.reuse_mode)
        self.worker_idle_timeout = worker_idle_timeout
        self.scheduler = SlurmScheduler(config, self.experiment_id)
        self.login = self.scheduler.login
        self.environments = SlurmEnvironments(self)
        self._cancelled: dict[str, TrialStatus] = {}
        self._lock = threading.Lock()
        self._ready = False

    # ---- the login node and batch scripts -------------------------------------------------------

    def _ensure_login(self) -> RemoteMachine:
        """The login node, probed and with the runtime (also for CLI commands without ``prepare()``)."""
        if not self._ready:
            with self._lock:
                if not self._ready:
                    self.login.probe()
                    claim(self.login.fs, self.login.root, self.experiment_id)  # marked: platform clean's to remove
                    self.login.install_runtime()
                    self._ready = True
        return self.login

    def batch_script(self, workdir: str, body: str) -> str:
        """A batch script: ``prepareCommand`` in the job's own shell (modules, conda), then ``body``."""
        prepare = self.config.prepare_command
        lines = ["#!/bin/sh", "# written by trialflow: a Slurm batch script", f"cd {_q(workdir)} || exit 1"]
        if prepare:
            lines.append(f"{{ {prepare}\n}} || {{ echo 'trialflow: prepareCommand failed' >&2; exit 1; }}")
        return "\n".join([*lines, body, ""])

    def runtime_command(self, module: str, *args: str) -> str:
        """The batch script's last line: a runtime module replacing the script's shell."""
        login = self.login
        return (f"PYTHONPATH={_q(login.runtime)} exec {_q(login.python)} -S -m trialflow.trial.{module} "
                + " ".join(_q(a) for a in args))

    # ---- prepare and code --------------------------------------------------------------------

    def prepare(self) -> None:
        try:
            login = self._ensure_login()
        except TransientPlatformError as exc:
            raise PlatformError(f"{exc} -- check host, port and that sshd runs there") from None
        check_version(login.run(login.command("keeper", "--version")).strip(), f"the trial keeper on {login.key}",
                      f"remove {login.runtime} there so that this controller installs its own", __version__)
        try:
            partitions = self.scheduler.run("sinfo -h -o %P").split()
        except PlatformError as exc:
            raise PlatformError(f"Slurm does not answer on {login.key}: {exc} -- check that slurmctld runs and, "
                                "when Slurm's commands need a module or SLURM_CONF, set loginCommand") from None
        wanted = self.config.partition
        if wanted and wanted not in {p.rstrip("*") for p in partitions}:
            raise PlatformError(f"partition {wanted!r} is not on the cluster (partitions: "
                                f"{', '.join(p.rstrip('*') for p in partitions)}); fix partition")

    def upload_code(self, code_dir: Path) -> CodeRef:
        login = self._ensure_login()
        bundle, digest = scan_bundle(code_dir, self.experiment_dir)
        install_code(login.fs, posixpath.join(login.root, "code", digest), digest, bundle.stream)
        return CodeRef(str(bundle.root), digest)

    # ---- submit ------------------------------------------------------------------------------

    def _trial_dir(self, trial_id: str) -> str:
        return posixpath.join(self.login.root, self.experiment_id, "trials", trial_id)

    def job_name(self, ident: str, attempt: int = 0) -> str:
        return f"tf-{self.experiment_id}-{ident}" + (f"-r{attempt}" if attempt else "")

    def submit(self, spec: TrialSpec, code: CodeRef) -> TrialHandle:
        login = self._ensure_login()
        trial_dir = self._trial_dir(spec.trial_id)
        code_dir = posixpath.join(login.root, "code", str(code.content_hash))
        env = trial_env(spec, self.platform, trial_dir, code_dir, None)
        env["PYTHONPATH"] = f"{posixpath.join(login.runtime, 'trialflow', 'trial', 'nni_shim')}:{login.runtime}"
        keeper = {"command": spec.command, "cwd": code_dir, "env": env, "attempt": spec.attempt}
        payload = {"trial_dir": trial_dir, "parameter": spec.parameter_record(), "keeper": keeper}
        meta = posixpath.join(trial_dir, META_DIR)
        set_aside_earlier_run(login.fs, trial_dir, spec.attempt)
        if self.reuse:
            return self._enqueue(spec, payload)
        login.run(login.command("keeper", "--submit"), json.dumps(dict(payload, hold=True)).encode())
        script = posixpath.join(meta, f"slurm-{spec.attempt}.sh")
        login.fs.write(script, self.batch_script(trial_dir, self.runtime_command(
            "keeper", "--batch", trial_dir, str(spec.attempt))).encode(), 0o700)
        name = self.job_name(spec.trial_id, spec.attempt)
        job_id = self.scheduler.sbatch(name, script, [f"--output={meta}/slurm-{spec.attempt}.log",
                                                      "--open-mode=append"])
        return TrialHandle(spec.trial_id, self.platform, {"job": name, "job_id": job_id, "trial_dir": trial_dir,
                                                          "reuse": False})

    def _enqueue(self, spec: TrialSpec, payload: dict[str, Any]) -> TrialHandle:
        """Reuse: queue the trial to an idle environment, or to a new one (named after its first
        trial, so a retried submit finds the same job)."""
        envs = self.environments
        with envs.lock:
            env = next((e for e in envs.envs.values() if e.trial == spec.trial_id), None) or \
                next((e for e in envs.envs.values() if e.trial is None and e.ended is None), None)
            if env is None:
                ident = spec.trial_id + (f"-r{spec.attempt}" if spec.attempt else "")
                env = envs.envs[ident] = Environment(ident, self.job_name(f"env-{ident}"))
            env.trial = spec.trial_id
        files = envs.files(env.id)
        if not env.job_id:
            try:
                files.fs.makedirs(files.path)
                files.heartbeat()
                script = self.batch_script(files.path, self.runtime_command(
                    "worker", "--foreground", files.path, str(self.worker_idle_timeout)))
                files.fs.write(posixpath.join(files.path, "job.sh"), script.encode(), 0o700)
                env.job_id = self.scheduler.sbatch(env.job, posixpath.join(files.path, "job.sh"),
                                         [f"--output={files.path}/slurm.log", "--open-mode=append"])
            except PlatformError:
                with envs.lock:
                    env.trial = None
                raise
        files.enqueue(spec.trial_id, payload)
        return TrialHandle(spec.trial_id, self.platform, {"job": env.job, "job_id": env.job_id, "env": env.id,
                                                          "trial_dir": payload["trial_dir"], "reuse": True})

    # ---- poll --------------------------------------------------------------------------------

    def poll(self, handle: TrialHandle, cursor: dict[str, Any]) -> TrialUpdate:
        login = self._ensure_login()
        reuse, trial_dir = bool(handle.data.get("reuse")), str(handle.data.get("trial_dir", ""))
        job = self.scheduler.job(str(handle.data.get("job", "")))  # before the files: an ended job's record is there
        if reuse:
            self.environments.heartbeat()
        found = read_trial(login.fs, trial_dir, int(cursor.get("metrics_offset", 0)), handle.trial_id)
        cursor = {"metrics_offset": found.offset}
        names, state, cancelled = found.names, found.state, self._cancelled.get(handle.trial_id)

        def update(status: TrialStatus, message: str | None = None) -> TrialUpdate:
            return TrialUpdate(status, found.records, cursor, None, message, found.errors)

        if names is None and not reuse:
            if job is not None and job.state in WAITING_STATES | RUNNING_STATES:
                self.scheduler.scancel(job.id)  # its allocation goes to the next trials
            raise LostHandleError(f"trial {handle.trial_id}: its directory {trial_dir or '?'} no longer exists on "
                                  f"{login.key}")
        if state is not None and (state.get("exit_code") == 0 or cancelled is not None):
            return self._ended(handle, found.update(cursor, cancelled))
        if job is not None and cancelled is None and job.id == str(handle.data.get("job_id") or job.id) and (
                job.state in INTERRUPTED_STATES or job.restarts > 0):
            self._ended(handle, None)
            return self.interrupted(handle, f"{job.describe()}, restarts: {job.restarts}", found.records, cursor)
        if job is None or job.state == "COMPLETED":
            if state is not None:
                return self._ended(handle, found.update(cursor))
            return self._ended(handle, update(cancelled or TrialStatus.SYS_CANCELED, (
                f"its environment's job {handle.data.get('job')} ended before the trial ran" if reuse else
                f"Slurm no longer knows job {handle.data.get('job')} and the trial recorded no end")))
        if job.state in FAILED_STATES or job.state == "CANCELLED":
            return self._ended(handle, self._job_ended(handle, job, state, cancelled, found.records, cursor,
                                                       found.errors))
        code = state.get("exit_code") if state else None
        if code is not None and int(code) < 128:  # the trial's own failure (a signal waits for Slurm's verdict)
            return self._ended(handle, found.update(cursor))
        return update(TrialStatus.RUNNING if STARTED in (names or ()) else TrialStatus.WAITING)

    def _job_ended(self, handle: TrialHandle, job: SlurmJob, state: dict[str, Any] | None,
                   cancelled: TrialStatus | None, records: list[Any], cursor: dict[str, Any],
                   errors: list[str]) -> TrialUpdate:
        """A job Slurm ended (not COMPLETED with a record): its state and reason are the cause."""
        code = state.get("exit_code") if state else None
        if job.state == "CANCELLED":
            return TrialUpdate(cancelled or TrialStatus.SYS_CANCELED, records, cursor, code,
                               None if cancelled else f"{job.describe()}: cancelled outside trialflow (scancel)",
                               errors)
        if job.state == "TIMEOUT":
            limit = self.config.time_limit or "the partition's default"
            why = f"{job.describe()}: the job reached its time limit (timeLimit: {limit})"
        else:
            why = job.describe()
        log_tail = tail_text(posixpath.join(handle.data.get("trial_dir", ""), META_DIR,
                                            f"slurm-{handle.data.get('attempt', 0)}.log"), fs=self.login.fs)
        stderr = tail_text(posixpath.join(handle.data.get("trial_dir", ""), STDERR_FILE), fs=self.login.fs)
        tail = stderr or log_tail
        return TrialUpdate(cancelled or TrialStatus.FAILED, records, cursor, code,
                           with_stderr_tail((f"exit code {code}; " if code is not None else "") + why, tail),
                           errors)

    def _ended(self, handle: TrialHandle, update: TrialUpdate | None) -> TrialUpdate:
        """Free the trial's environment (reuse) once its end is known; ``None``: the environment itself
        was interrupted and takes no more trials."""
        self.environments.release(handle.trial_id, None if update is not None else "interrupted")
        return update  # type: ignore[return-value]

    # ---- cancel, adopt, logs, close ----------------------------------------------------------

    def cancel(self, handle: TrialHandle, reason: TrialStatus) -> None:
        self._ensure_login()
        self._cancelled[handle.trial_id] = reason
        if handle.data.get("reuse"):
            env = self.environments.assign(handle)
            files = self.environments.files(env.id)
            files.dequeue(handle.trial_id)
            files.kill(handle.trial_id, handle.data["trial_dir"])
            job = self.scheduler.job(env.job)
            if job is not None and (job.state in INTERRUPTED_STATES or job.restarts > 0 or job.state in WAITING_STATES):
                env.ended = env.ended or "cancelled"
                self.scheduler.scancel(job.id)  # an interrupted or never-started environment is of no further use
            return
        trial_dir = str(handle.data.get("trial_dir", ""))
        # scancel signals the keeper and the trial at once: a trial that answers with a code of its own
        # before its keeper notes the signal must still read as stopped
        self.login.conn.run(self.login.command("keeper", "--mark-stop", trial_dir))
        self.scheduler.scancel(str(handle.data.get("job_id", "")))
        # a trial whose job had not started yet is claimed here, so no late (or requeued) run starts it
        self.login.conn.run(self.login.command("keeper", "--never-start", trial_dir))

    def adopt(self, handle: TrialHandle) -> None:
        """Re-attach after a restart: a reuse trial's environment is known again."""
        self._ensure_login()
        if handle.data.get("reuse"):
            self.environments.assign(handle)

    def logs(self, handle: TrialHandle, tail: int | None = None) -> dict[str, str]:
        """The trial's logs, copied into the local trial directory first (over SFTP with ``host``)."""
        login = self._ensure_login()
        local_dir = self.experiment_dir / "trials" / handle.trial_id
        local_dir.mkdir(parents=True, exist_ok=True)
        for name in LOG_FILES:
            source = posixpath.join(handle.data["trial_dir"], name)
            if isinstance(login.fs, LocalFS):
                if Path(source).is_file():
                    shutil.copyfile(source, local_dir / name)
            else:
                login.fs.download(source, local_dir / name)
        return read_trial_logs(local_dir, tail)

    output_read_seconds = 1.0

    def read_output(self, handle: TrialHandle, offsets: dict[str, int]) -> dict[str, bytes]:
        out = {}
        for name in OUTPUT_FILES:
            data = self.login.fs.read(posixpath.join(handle.data["trial_dir"], name), offsets.get(name, 0))
            if data:
                out[name] = data
        return out

    def output_folder(self, handle: TrialHandle, name: str) -> Path | None:
        login = self._ensure_login()
        source = posixpath.join(handle.data["trial_dir"], name)
        if isinstance(login.fs, LocalFS):
            return Path(source)
        target = self.experiment_dir / "trials" / handle.trial_id / name
        login.fs.download(source, target)
        return target

    def clean(self, dry_run: bool = False) -> list[str]:
        """On the login node, trialflow's marked folders under ``remoteWorkingDirectory`` (code bundles,
        runtimes, every experiment's folder) and nothing else; refused for ``/`` or a home folder (see
        :func:`~trialflow.platforms.remote_machine.clean_machines`)."""
        return clean_machines([self.login], dry_run)

    def close(self) -> None:
        """Stop the idle environments (their workers leave and their jobs end) and cancel the jobs of
        those whose trial was cancelled (a Ctrl-C or stop leaves no allocation behind); environments
        running a trial are left alone and leave after their idle timeout once no heartbeat comes.
        Close the login connection."""
        for env in list(self.environments.envs.values()):
            if env.ended is not None or (env.trial is not None and env.trial not in self._cancelled):
                continue
            try:
                self.environments.files(env.id).stop()
                if env.trial is not None:
                    self.scheduler.scancel(env.job_id)
            except PlatformError as exc:
                log.warning("environment %s was not stopped (%s); it leaves after %.0f s without a heartbeat",
                            env.id, exc, self.worker_idle_timeout)
        self.environments.envs.clear()
        self.login.conn.close()


PLATFORM = Platform(SlurmConfig, SlurmTrainingService, SSHCredentials)  # the block: its SSH route to a login node
