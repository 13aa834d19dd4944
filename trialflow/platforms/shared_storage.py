"""Job platforms on a mounted share: the base every cluster and cloud job platform subclasses
(Kubeflow, FrameworkController, AdaptDL today; OpenPAI, DLTS, PAI-DLC and Azure ML describe the same
local-mount / container-path model).

The share is mounted on this machine (``localMountPoint``) and in the jobs' containers (the
container path). Code bundles, the trial runtime and trial directories live on it, so a job needs no
upload of its own; see :class:`SharedStorage` for the layout.

Lifecycle. ``prepare()`` checks the share, installs the trial runtime once per version, runs the
platform's own checks (:meth:`SharedStorageService.prepare_platform`) and, for
``metricChannel: http``, starts the metrics receiver (its port is kept in the experiment directory,
so a resumed controller listens where running jobs push). ``upload_code()`` extracts the code bundle
on the share once per content hash.

Without reuse, ``submit`` writes the trial directory (``parameter.cfg``, the keeper spec and one
``run_<role>.sh`` per role), stores the trial's metrics token with the platform, then starts the
job, named deterministically; platforms look the name up first, so a retried submit never creates a
second job. ``poll`` maps the job's state through the platform's table; metrics come from the
receiver (then, at the end, the job logs fill any gap), from the job logs only, or from the file on
the share. ``cancel`` deletes the job (the caller recorded the status first). A job deleted by
someone else ends its trial as SYS_CANCELED.

With ``reuseMode: true`` an environment is one long-lived job running the reuse worker on the
share; trials are queued to it as files, and an environment takes the next trial when its last one
ended (never more environments than trials in flight). A trial whose environment ended or vanished
is SYS_CANCELED. ``close()`` stops and deletes the environments.

A platform implements the abstract methods below: the job (start, state, delete, logs), the
token's home (store, read, delete) and its names and roles.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import threading
import time
from abc import abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..codebundle import CodeDirError, scan_code_dir
from ..trial.procs import write_atomic
from ..trial.protocol import (
    HEARTBEAT_SECONDS,
    KEEPER_SPEC,
    META_DIR,
    PARAMETER_FILE,
    STARTED,
    STATE,
    STDERR_FILE,
    STDOUT_FILE,
    WORKER_IDLE_TIMEOUT,
)
from ..trial.records import MetricRecord
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
from .metric_channel import MetricChannel
from .metrics_receiver import MetricsReceiver
from .runtime_files import runtime_files, runtime_key
from .trialdir import (
    LOCAL,
    EnvironmentDir,
    install_code,
    install_tree,
    read_from,
    read_json,
    read_output_files,
    read_trial,
    read_trial_logs,
    tail_text,
)

log = logging.getLogger("trialflow.platforms")
ENV_CHECK_SECONDS = 2.0


class SharedStorage:
    """The share as this machine sees it (``local``) and as containers see it (``container``).
    Layout under both::

        nni/runtime/<version>-<hash>/   the trial runtime (keeper, worker, nni package)
        nni/code/<content hash>/        extracted code bundles
        nni/<experiment>/trials/<id>/   trial directories
        nni/<experiment>/envs/<id>/     reuse-mode environments
    """

    def __init__(self, local: Path | None, container: str, what: str) -> None:
        self._local = local
        self.container = container.rstrip("/")
        self.what = what
        self._lock = threading.Lock()

    @property
    def local(self) -> Path:
        if self._local is None:
            raise PlatformError(f"{self.what} is not mounted on this machine: mount it (for NFS: sudo mount -t nfs "
                                "<server>:<path> <folder>) and set its localMountPoint to that folder")
        return self._local

    def check(self) -> None:
        if not self.local.is_dir():
            raise PlatformError(f"localMountPoint {self.local} of {self.what} is not a directory; mount the share "
                                "there first")
        if not os.access(self.local, os.W_OK):
            raise PlatformError(f"localMountPoint {self.local} of {self.what} is not writable by this user "
                                "(NFS root_squash? give the export to this user)")

    def path(self, *parts: str) -> Path:
        return self.local.joinpath("nni", *parts)

    def container_path(self, *parts: str) -> str:
        return "/".join([self.container, "nni", *parts])

    def clean(self) -> list[str]:
        """Remove trialflow's folders from the share: the runtimes, the code bundles and every
        experiment's folder (one holding ``trials`` or ``envs``); nothing else under ``nni/``. Returns
        what was removed."""
        self.check()
        root = self.path()
        removed = []
        for child in sorted(root.iterdir()) if root.is_dir() else []:
            if child.is_dir() and (child.name in ("code", "runtime") or (child / "trials").is_dir()
                                   or (child / "envs").is_dir()):
                shutil.rmtree(child)
                removed.append(f"{self.what}: {child}")
        return removed

    def install_runtime(self, key: str, files: list[tuple[str, Path]]) -> None:
        install_tree(LOCAL, str(self.path("runtime", key)), files)

    def install_code(self, code_dir: Path, cache_file: Path) -> str:
        """Extract the code bundle once per content hash; returns the hash."""
        try:
            bundle = scan_code_dir(code_dir)
        except CodeDirError as exc:
            raise PlatformError(str(exc)) from None
        digest = bundle.content_hash(cache_file)
        with self._lock:
            install_code(LOCAL, str(self.path("code", digest)), digest, bundle.stream)
        return digest


@dataclass
class Environment:
    """A reuse-mode job and the trial it runs (one at a time)."""

    id: str
    job: str
    trial: str | None = None
    ended: str | None = None  # why the job is gone
    token: str | None = None  # its metrics token (HTTP channel), kept to grant each new trial
    checked: float = 0.0
    started: bool = True  # False until the platform accepted its job (a failed start is retried as is)


class SharedStorageService(TrainingService):
    """A job platform whose jobs mount the share; subclasses implement the abstract methods."""

    reuse_supported = True
    logs_on_share = False  # True: job logs are the trial's stdout on the share (no log API used)
    other_channels = "metricChannel: file (metrics through the shared storage)"  # hint without the receiver

    def __init__(self, config: Any, experiment_dir: Path) -> None:
        self.config = config
        self.experiment_dir = Path(experiment_dir)
        self.experiment_id = self.experiment_dir.name
        self.channel = getattr(config, "metric_channel", "http")
        self.metrics = MetricChannel(self.channel, config.nni_manager_ip, self.experiment_dir)
        self.reuse = bool(getattr(config, "reuse_mode", False)) and self.reuse_supported
        self.storage = self.make_storage()
        self.worker_idle_timeout = WORKER_IDLE_TIMEOUT
        self._lock = threading.Lock()
        self._cancelled: dict[str, TrialStatus] = {}
        self.envs: dict[str, Environment] = {}
        self._last_heartbeat = 0.0

    @property
    def receiver(self) -> MetricsReceiver | None:
        """The HTTP channel's metrics receiver (None before ``prepare()`` and with other channels)."""
        return self.metrics.receiver

    @receiver.setter
    def receiver(self, receiver: MetricsReceiver | None) -> None:
        self.metrics.receiver = receiver

    def clean(self) -> list[str]:
        """trialflow's folders on the share (runtimes, code bundles, experiments' trial folders)."""
        return self.storage.clean()

    # ---- what a platform implements -----------------------------------------------------------

    @abstractmethod
    def make_storage(self) -> SharedStorage:
        """The share, from the platform's config."""

    @abstractmethod
    def roles(self) -> dict[str, str]:
        """Role name -> the command its replicas run (non-reuse); the first role is the primary one."""

    @abstractmethod
    def job_name(self, kind: str, ident: str) -> str:
        """The deterministic name of a trial's (``kind='trial'``) or an environment's (``'env'``) job."""

    @abstractmethod
    def start_job(self, name: str, ids: dict[str, str], commands: dict[str, list[str]], token_ref: str) -> None:
        """Create the job ``name`` unless it exists; ``commands`` holds each role's container command,
        ``token_ref`` where :meth:`store_token` put the metrics token (given to the job, never inline)."""

    @abstractmethod
    def job_status(self, name: str) -> tuple[TrialStatus, str | None] | None:
        """The platform's state table applied to the job: (status, message), None when it is gone."""

    @abstractmethod
    def delete_job(self, name: str) -> None:
        """Stop and delete the job and what was made for it; an unknown job is not an error."""

    @abstractmethod
    def store_token(self, name: str, token: str, ids: dict[str, str]) -> str:
        """Keep ``token`` with the platform as ``name`` unless one is stored; returns the stored one."""

    @abstractmethod
    def read_token(self, name: str) -> str | None:
        """The token stored as ``name``, None when there is none."""

    @abstractmethod
    def delete_token(self, name: str) -> None:
        """Forget the token stored as ``name`` (idempotent)."""

    def job_logs(self, name: str) -> dict[str, bytes]:
        """The job's output by replica (whole logs); the ``logs`` metric channel and the HTTP channel's
        gap filler read it. Default: none (the trial's files on the share are read instead)."""
        return {}

    def check_platform(self) -> None:
        """Connect and check credentials once (fail fast with a hint)."""

    def platform_address(self) -> str:
        """The URL of the platform's API server (where its jobs run, for the receiver check)."""
        return ""

    def check_receiver_reachable(self) -> None:
        """Raise ``PlatformError`` when the platform's jobs could not reach the metrics receiver."""
        self.metrics.check_reachable(self.platform_address(), self.other_channels)

    def prepare_platform(self) -> None:
        """Platform objects made once per experiment (registry and storage secrets)."""

    # ---- prepare and code ------------------------------------------------------------------

    def prepare(self) -> None:
        self.check_platform()
        self.storage.check()
        self.storage.install_runtime(runtime_key(), runtime_files())
        self.prepare_platform()
        self.metrics.start()

    @property
    def runtime_dir(self) -> str:
        return self.storage.container_path("runtime", runtime_key())

    def upload_code(self, code_dir: Path) -> CodeRef:
        digest = self.storage.install_code(code_dir, self.experiment_dir.parent / ".cache" / "bundle-hashes.json")
        return CodeRef(self.storage.container_path("code", digest), digest)

    # ---- submit ----------------------------------------------------------------------------

    def keeper_env(self, spec: TrialSpec) -> dict[str, str]:
        """NNI's trial environment as the job's keeper sets it (GPU visibility is the platform's:
        its device plugin decides, so nothing is overridden here)."""
        channel = self.metrics.keeper_value()
        return {"NNI_PLATFORM": self.platform, "NNI_EXP_ID": spec.experiment_id, "NNI_TRIAL_JOB_ID": spec.trial_id,
                "NNI_TRIAL_SEQ_ID": str(spec.sequence), "TRIALFLOW_METRIC_CHANNEL": channel}

    def _keeper_spec(self, spec: TrialSpec, code: CodeRef) -> dict[str, Any]:
        command = spec.command if self.reuse else next(iter(self.roles().values()))
        return {"command": command, "cwd": f"../../../code/{code.content_hash}", "env": self.keeper_env(spec),
                "located": True, "roles": self.roles()}

    def metrics_url(self) -> str | None:
        """Where jobs push metrics (None without the HTTP channel)."""
        return self.metrics.url

    def _token(self, name: str, ids: dict[str, str], *trial_ids: str) -> str | None:
        """The token stored as ``name`` (created unless it exists), granted ``trial_ids``."""
        return self.metrics.token(lambda token: self.store_token(name, token, ids), *trial_ids)

    def submit(self, spec: TrialSpec, code: CodeRef) -> TrialHandle:
        trial_dir = self.storage.path(spec.experiment_id, "trials", spec.trial_id)
        (trial_dir / META_DIR).mkdir(parents=True, exist_ok=True)
        write_atomic(str(trial_dir / PARAMETER_FILE), spec.parameter_record())
        keeper = self._keeper_spec(spec, code)
        write_atomic(str(trial_dir / META_DIR / KEEPER_SPEC), keeper)
        self.metrics.track(spec.trial_id)
        if self.reuse:
            return self._submit_to_environment(spec, keeper)
        name = self.job_name("trial", spec.trial_id)
        primary = next(iter(self.roles()))
        commands = {}
        for role in self.roles():
            script = trial_dir / f"run_{role.lower()}.sh"
            write_atomic(str(script), self._script(["--pod", f"trials/{spec.trial_id}", role, primary], "keeper"))
            commands[role] = ["sh", self.storage.container_path(spec.experiment_id, "trials", spec.trial_id,
                                                                script.name)]
        ids = {"trialId": spec.trial_id}
        self._token(f"{name}-token", ids, spec.trial_id)
        self.start_job(name, ids, commands, f"{name}-token")
        return TrialHandle(spec.trial_id, self.platform, {"job": name, "reuse": False, **self.handle_extra()})

    def handle_extra(self) -> dict[str, Any]:
        """Platform fields kept in every handle (e.g. the Kubernetes namespace)."""
        return {}

    def _script(self, args: list[str], module: str) -> str:
        """A run script that finds the runtime relative to itself (the controller and the job see the
        share at different paths)."""
        quoted = " ".join(f"\"$exp/{a}\"" if "/" in a else f"'{a}'" for a in args)
        return ("#!/bin/sh\n# written by trialflow: runs in the job's container\n"
                'here=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd)\n'
                'exp=$(CDPATH= cd -- "$here/../.." && pwd)\n'
                'nni=$(CDPATH= cd -- "$exp/.." && pwd)\n'
                f'PYTHONPATH="$nni/runtime/{os.path.basename(self.runtime_dir)}" '
                f"exec python3 -S -m trialflow.trial.{module} {quoted}\n")

    # ---- reuse-mode environments -------------------------------------------------------------

    def _env_dir(self, env_id: str) -> Path:
        return self.storage.path(self.experiment_id, "envs", env_id)

    def _env(self, env_id: str) -> EnvironmentDir:
        return EnvironmentDir(LOCAL, str(self._env_dir(env_id)))

    def _submit_to_environment(self, spec: TrialSpec, keeper: dict[str, Any]) -> TrialHandle:
        env = self._free_environment(spec.trial_id)
        payload = {"trial_dir": f"../../trials/{spec.trial_id}", "parameter": spec.parameter_record(),
                   "keeper": keeper}
        if env.token is not None:
            self.metrics.grant(env.token, spec.trial_id)
        elif self.receiver is not None:  # an environment re-attached on resume: its token is stored
            env.token = self._token(f"{env.job}-token", {"envId": env.id}, spec.trial_id)
        self._env(env.id).enqueue(spec.trial_id, payload)
        return TrialHandle(spec.trial_id, self.platform, {"job": env.job, "env": env.id, "reuse": True,
                                                          **self.handle_extra()})

    def _free_environment(self, trial_id: str) -> Environment:
        """An idle environment, now running ``trial_id``; a new one when none is idle."""
        with self._lock:
            pending = next((e for e in self.envs.values() if e.trial == trial_id and not e.started), None)
            if pending is None:  # a retried submit starts the same environment again, never a second one
                for env in self.envs.values():
                    if env.trial is None and env.ended is None:
                        env.trial = trial_id
                        return env
            env = pending or Environment(secrets.token_hex(4), "", trial_id, started=False)
            env_id = env.id
            env.job = self.job_name("env", env_id)
            self.envs[env_id] = env
        env_dir = self._env_dir(env_id)
        env_dir.mkdir(parents=True, exist_ok=True)
        self._env(env_id).heartbeat()
        write_atomic(str(env_dir / "run.sh"), self._script(
            ["--foreground", f"envs/{env_id}", str(self.worker_idle_timeout)], "worker"))
        ids = {"envId": env_id}
        env.token = self._token(f"{env.job}-token", ids)
        command = ["sh", self.storage.container_path(self.experiment_id, "envs", env_id, "run.sh")]
        self.start_job(env.job, ids, {next(iter(self.roles())): command}, f"{env.job}-token")
        env.started = True
        return env

    def _assign(self, handle: TrialHandle) -> Environment:
        with self._lock:
            env = self.envs.get(str(handle.data.get("env")))
            if env is None:
                env = self.envs[handle.data["env"]] = Environment(handle.data["env"], handle.data["job"])
            env.trial = handle.trial_id
            return env

    def _environment_gone(self, env: Environment, force: bool = False) -> str | None:
        now = time.monotonic()
        if env.ended is None and (force or now - env.checked >= ENV_CHECK_SECONDS):
            env.checked = now
            found = self.job_status(env.job)
            if found is None:
                env.ended = f"its environment job {env.job} was deleted"
            elif found[0].is_terminal:
                env.ended = f"its environment job {env.job} ended ({found[0].value}: {found[1]})"
        return env.ended

    def _heartbeat(self) -> None:
        if time.monotonic() - self._last_heartbeat < HEARTBEAT_SECONDS:
            return
        self._last_heartbeat = time.monotonic()
        for env in list(self.envs.values()):
            if env.ended is None:
                try:
                    self._env(env.id).heartbeat()
                except OSError as exc:  # the worker leaves only after the idle timeout; the next beat retries
                    log.warning("environment %s: heartbeat not written (%s); retrying in %.0f s", env.id, exc,
                                HEARTBEAT_SECONDS)

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
        records, errors = self._metrics(handle, cursor, status.is_terminal and found is not None)
        if not status.is_terminal:
            return TrialUpdate(status, records, cursor, None, message, errors)
        return self._job_ended(handle, status, message, records, cursor, errors)

    def _job_ended(self, handle: TrialHandle, status: TrialStatus, message: str | None, records: list[MetricRecord],
                   cursor: dict[str, Any], errors: list[str]) -> TrialUpdate:
        """A non-reuse trial whose job ended: the job's status, with the keeper's exit code."""
        trial_dir = self._trial_dir(handle)
        exit_code = (read_json(LOCAL, str(trial_dir / META_DIR / STATE)) or {}).get("exit_code")
        if status == TrialStatus.FAILED:
            tail = tail_text(trial_dir / STDERR_FILE)
            message = (f"exit code {exit_code}; " if exit_code is not None else "") + (message or "failed") + \
                (f"; stderr tail:\n{tail}" if tail else "")
        self._finish(handle)
        return TrialUpdate(status, records, cursor, exit_code if isinstance(exit_code, int) else None, message, errors)

    def _poll_reuse(self, handle: TrialHandle, cursor: dict[str, Any]) -> TrialUpdate:
        env = self._assign(handle)
        self._heartbeat()
        gone = self._environment_gone(env)  # the platform call first: it may fail, the reads below do not
        found = read_trial(LOCAL, str(self._trial_dir(handle)), 0, handle.trial_id, metrics=False)
        state, cancelled = found.state, self._cancelled.get(handle.trial_id)
        if state is not None and state.get("exit_code") != 0 and gone is None and cancelled is None:
            gone = self._environment_gone(env, force=True)  # killed with its environment: not the trial's failure
        found.records, found.errors = self._metrics(handle, cursor, state is not None or gone is not None)
        if state is not None and (gone is None or state.get("exit_code") == 0):
            self._finish(handle)
            return found.update(cursor, cancelled)
        if gone is not None:
            self._finish(handle)
            return TrialUpdate(cancelled or TrialStatus.SYS_CANCELED, found.records, cursor, None,
                               f"the trial did not finish: {gone}", found.errors)
        status = TrialStatus.RUNNING if STARTED in (found.names or ()) else TrialStatus.WAITING
        return TrialUpdate(status, found.records, cursor, None, None, found.errors)

    def _metrics(self, handle: TrialHandle, cursor: dict[str, Any], final: bool
                 ) -> tuple[list[MetricRecord], list[str]]:
        """New metrics of the trial from its channel(s), without duplicates."""
        trial_dir = self._trial_dir(handle)

        def log_chunks(offsets: dict[str, int]) -> dict[str, tuple[int, bytes]]:
            if handle.data.get("reuse") or self.logs_on_share:  # the trial's stdout file, from where we left off
                start = int(offsets.get(STDOUT_FILE, 0))
                return {STDOUT_FILE: (start, read_from(trial_dir / STDOUT_FILE, start))}
            return {pod: (int(offsets.get(pod, 0)), data[int(offsets.get(pod, 0)):])  # job logs come whole
                    for pod, data in self.job_logs(handle.data["job"]).items()}

        return self.metrics.read(handle.trial_id, trial_dir, cursor, final, log_chunks)

    def _finish(self, handle: TrialHandle) -> None:
        with self._lock:
            for env in self.envs.values():
                if env.trial == handle.trial_id:
                    env.trial = None
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
        self._env(str(handle.data["env"])).kill(handle.trial_id, f"../../trials/{handle.trial_id}")

    def adopt(self, handle: TrialHandle) -> None:
        """Re-attach after a restart: the environment is known again, and the token (read back from
        the platform) is accepted again by this controller's receiver."""
        self.metrics.track(handle.trial_id)
        if handle.data.get("reuse"):
            self._assign(handle)
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
        for env in list(self.envs.values()):
            try:
                self._env(env.id).stop()
                _retrying(lambda job=env.job: self.delete_job(job))
                self.delete_token(f"{env.job}-token")
            except (PlatformError, OSError) as exc:  # the worker still leaves after its idle timeout
                log.warning("environment %s (%s) not stopped: %s; it leaves after %.0f s without a heartbeat",
                            env.id, env.job, exc, self.worker_idle_timeout)
        self.envs.clear()
        self.metrics.stop()


def _retrying(call: Any, delays: tuple[float, ...] = (0.2, 0.5, 1.0, 2.0)) -> None:
    """``call()``, again after each delay while it fails with a transient platform error."""
    for delay in delays:
        try:
            return call()
        except TransientPlatformError:
            time.sleep(delay)
    call()
