"""Reuse-mode environments (``reuseMode: true``): each is one long-lived job running the reuse worker,
taking the trials queued to it as files one at a time. :class:`EnvironmentTable` is what every platform
with environments keeps alike (Slurm uses it directly); :class:`EnvironmentPool` the environments of a
job platform on a share.

Lifecycle. :meth:`EnvironmentPool.submit` queues a trial to an idle environment, or starts a new one
when none is idle (so never more environments than trials in flight); a retried submit starts the
same environment again, never a second one. Polls call :meth:`~EnvironmentPool.assign` (which also
re-attaches environments after a controller restart), :meth:`~EnvironmentPool.heartbeat` and
:meth:`~EnvironmentPool.gone`; :meth:`~EnvironmentPool.release` frees an environment when its trial
ended; :meth:`~EnvironmentPool.close` stops and deletes them all.

Thread-safety: the pool is shared by every trial's poll; its table is guarded by one lock and no
platform call is made while holding it. Platform calls raise what the service's calls raise
(``PlatformError``, ``TransientPlatformError``)."""

from __future__ import annotations

import functools
import logging
import secrets
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..trial.procs import write_atomic
from ..trial.protocol import HEARTBEAT_SECONDS, WORKER_IDLE_TIMEOUT
from .errors import PlatformError, RetryPolicy
from .trialdir import LOCAL, EnvironmentDir

if TYPE_CHECKING:
    from .base import TrialHandle, TrialSpec, TrialStatus
    from .metric_channel import MetricChannel
    from .metrics_receiver import MetricsReceiver
    from .mounted_share import MountedShare

log = logging.getLogger("trialflow.platforms")
ENV_CHECK_SECONDS = 2.0
DELETE_RETRY = RetryPolicy(retries=4, delay=0.2)


@dataclass
class Environment:
    """A reuse-mode job and the trial it runs (one at a time)."""

    id: str
    job: str
    trial: str | None = None
    ended: str | None = None  # why the job is gone
    job_id: str = ""  # the platform's own id of the job, where it is not its name (Slurm's job id)
    token: str | None = None  # its metrics token (HTTP channel), kept to grant each new trial
    checked: float = 0.0
    started: bool = True  # False until the platform accepted its job (a failed start is retried as is)


class JobHost(Protocol):
    """What the pool uses of its service (a ``JobPlatformService``): the share, the metric channel
    and the platform's job and token calls."""

    experiment_id: str
    storage: MountedShare
    metrics: MetricChannel

    @property
    def receiver(self) -> MetricsReceiver | None: ...
    def roles(self) -> dict[str, str]: ...
    def job_name(self, kind: str, ident: str) -> str: ...
    def job_token(self, name: str, ids: dict[str, str], *trial_ids: str) -> str | None: ...
    def run_script(self, args: list[str], module: str) -> str: ...
    def start_job(self, name: str, ids: dict[str, str], commands: dict[str, list[str]], token_ref: str) -> None: ...
    def job_status(self, name: str) -> tuple[TrialStatus, str | None] | None: ...
    def job_restarting(self, name: str, state: dict[str, Any]) -> bool: ...
    def delete_job(self, name: str) -> None: ...
    def delete_token(self, name: str) -> None: ...


class EnvironmentTable(ABC):
    """A service's reuse environments by id and the trial each runs, what every platform with reuse
    environments keeps alike (job platforms through :class:`EnvironmentPool`, Slurm directly): which
    environment runs a trial, freeing it when the trial ended, and the heartbeat every running one
    gets. Starting an environment and telling that its job is gone are the platform's.

    Thread-safety: the table is shared by every trial's poll; it is guarded by one lock, and no
    platform call is made while holding it."""

    def __init__(self) -> None:
        self.envs: dict[str, Environment] = {}
        self.lock = threading.Lock()  # held to read or change ``envs``
        self._last_heartbeat = 0.0

    @abstractmethod
    def files(self, env_id: str) -> EnvironmentDir:
        """The folder environment ``env_id`` takes its trials from (its queue, kill requests, heartbeat)."""

    def assign(self, handle: TrialHandle) -> Environment:
        """The environment the handle names, now running its trial (known again after a restart)."""
        with self.lock:
            env = self.envs.get(str(handle.data.get("env")))
            if env is None:
                env = self.envs[handle.data["env"]] = Environment(handle.data["env"], handle.data["job"],
                                                                  job_id=str(handle.data.get("job_id", "")))
            env.trial = handle.trial_id
            return env

    def ended(self, env_id: str) -> bool:
        """Whether environment ``env_id`` is known gone: its worker runs nothing of ours."""
        with self.lock:
            env = self.envs.get(env_id)
            return env is not None and env.ended is not None

    def release(self, trial_id: str, gone: str | None = None) -> None:
        """The trial ended: its environment takes the next one; ``gone`` says why it takes none any more."""
        with self.lock:
            for env in self.envs.values():
                if env.trial == trial_id:
                    env.trial = None
                    env.ended = env.ended or gone

    def heartbeat(self) -> None:
        """Tell every running environment that its controller lives (at most every few seconds); a beat
        not written is logged and tried again at the next (the worker leaves only after its idle timeout)."""
        if time.monotonic() - self._last_heartbeat < HEARTBEAT_SECONDS:
            return
        self._last_heartbeat = time.monotonic()
        for env in list(self.envs.values()):
            if env.ended is None:
                try:
                    self.files(env.id).heartbeat()
                except (OSError, PlatformError) as exc:
                    log.warning("environment %s: heartbeat not written (%s); retrying in %.0f s", env.id, exc,
                                HEARTBEAT_SECONDS)


class EnvironmentPool(EnvironmentTable):
    """The environments of one job platform service (its jobs, tokens and share)."""

    def __init__(self, service: JobHost) -> None:
        super().__init__()
        self.service = service
        self.idle_timeout = WORKER_IDLE_TIMEOUT

    def folder(self, env_id: str) -> Path:
        return self.service.storage.path(self.service.experiment_id, "envs", env_id)

    def files(self, env_id: str) -> EnvironmentDir:
        return EnvironmentDir(LOCAL, str(self.folder(env_id)))

    def submit(self, spec: TrialSpec, keeper: dict[str, Any]) -> dict[str, Any]:
        """Queue the trial (its directory written already) to an environment; returns the handle's
        fields naming it."""
        env = self._free_environment(spec.trial_id)
        payload = {"trial_dir": f"../../trials/{spec.trial_id}", "parameter": spec.parameter_record(),
                   "keeper": keeper}
        if env.token is not None:
            self.service.metrics.grant(env.token, spec.trial_id)
        elif self.service.receiver is not None:  # an environment re-attached on resume: its token is stored
            env.token = self.service.job_token(f"{env.job}-token", {"envId": env.id}, spec.trial_id)
        self.files(env.id).enqueue(spec.trial_id, payload)
        return {"job": env.job, "env": env.id, "reuse": True}

    def _free_environment(self, trial_id: str) -> Environment:
        """An idle environment, now running ``trial_id``; a new one when none is idle."""
        service = self.service
        with self.lock:
            pending = next((e for e in self.envs.values() if e.trial == trial_id and not e.started), None)
            if pending is None:  # a retried submit starts the same environment again, never a second one
                for env in self.envs.values():
                    if env.trial is None and env.ended is None:
                        env.trial = trial_id
                        return env
            env = pending or Environment(secrets.token_hex(4), "", trial_id, started=False)
            env.job = service.job_name("env", env.id)
            self.envs[env.id] = env
        folder = self.folder(env.id)
        folder.mkdir(parents=True, exist_ok=True)
        self.files(env.id).heartbeat()
        write_atomic(str(folder / "run.sh"), service.run_script(
            ["--foreground", f"envs/{env.id}", str(self.idle_timeout)], "worker"))
        ids = {"envId": env.id}
        env.token = service.job_token(f"{env.job}-token", ids)
        command = ["sh", service.storage.container_path(service.experiment_id, "envs", env.id, "run.sh")]
        service.start_job(env.job, ids, {next(iter(service.roles())): command}, f"{env.job}-token")
        env.started = True
        return env

    def gone(self, env: Environment, force: bool = False) -> str | None:
        """Why the environment's job is gone (deleted, ended, or run again in place by the platform),
        None while it runs; the platform is asked at most every few seconds unless ``force``."""
        now = time.monotonic()
        if env.ended is None and (force or now - env.checked >= ENV_CHECK_SECONDS):
            env.checked = now
            found = self.service.job_status(env.job)
            if found is None:
                env.ended = f"its environment job {env.job} was deleted"
            elif found[0].is_terminal:
                env.ended = f"its environment job {env.job} ended ({found[0].value}: {found[1]})"
            elif self.service.job_restarting(env.job, {}):  # its worker runs again, the trials it ran do not
                self.abandon(env, f"its environment job {env.job} is run again in place")
        return env.ended

    def abandon(self, env: Environment, why: str) -> str:
        """Give environment ``env`` up (``why``): no trial goes to it any more, and its worker (one the
        platform runs again) is asked to leave. Returns ``why``."""
        env.ended = why
        self.files(env.id).stop()
        return why

    def close(self) -> None:
        """Stop and delete every environment's job and token; one that cannot be deleted is logged
        (its worker still leaves after the idle timeout)."""
        for env in list(self.envs.values()):
            try:
                self.files(env.id).stop()
                DELETE_RETRY.call(functools.partial(self.service.delete_job, env.job))
                self.service.delete_token(f"{env.job}-token")
            except (PlatformError, OSError) as exc:
                log.warning("environment %s (%s) not stopped: %s; it leaves after %.0f s without a heartbeat",
                            env.id, env.job, exc, self.idle_timeout)
        self.envs.clear()
