"""The base of job platforms spoken to over a REST API -- directly (OpenPAI, DLTS, with
:class:`RestApi`) or through the platform's SDK (PAI-DLC, Azure ML) -- whose secret store and log API
trialflow does not use: metrics tokens live on the share (:class:`TokensOnShare`), a job's logs are
its trial's stdout on the share, and the client is made on first use (:meth:`RestJobService.connect`)
and closed (when it has ``close()``) with the service.

Job ids. Platforms whose job names are not unique keys (DLTS, PAI-DLC) find a job by name with
:meth:`RestJobService.find_jobs`; :meth:`RestJobService.job_id` keeps the newest match per name, so
a retried submit finds the job an earlier attempt created and later calls skip the lookup.

State tables. :meth:`RestJobService.apply_states` applies a platform's table: a state it does not
know keeps the job's previous state (WAITING at first) and is logged, as docs/platforms.md#job-states asks; a
state mapped to SYS_CANCELED (a stop) becomes the cancel reason trialflow recorded when it asked for
the stop (:class:`JobPlatformService`'s rule).
"""

from __future__ import annotations

import logging
import os
import shlex
import threading
import time
from abc import abstractmethod
from pathlib import Path
from typing import Any

from .base import ConfigT, TrialStatus
from .job_platform import JobPlatformService
from .mounted_share import MountedShare

log = logging.getLogger("trialflow.platforms")


class TokensOnShare:
    """The metrics token's home for platforms without a secret store of their own (OpenPAI, DLTS): a
    file only its owner may read, ``nni/<experiment>/tokens/<name>`` on the share. The job's keeper
    reads it through ``TRIALFLOW_METRICS_TOKEN_FILE``, so the token is never in a job's request body,
    command line or the platform's job records. Mixed in before :class:`JobPlatformService`."""

    storage: MountedShare
    experiment_id: str

    def _token_path(self, name: str) -> Path:
        return self.storage.path(self.experiment_id, "tokens", name)

    def store_token(self, name: str, token: str, ids: dict[str, str]) -> str:
        path = self._token_path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(path.parent, 0o700)
        partial = path.with_name(f".{name}.{os.getpid()}-{time.time_ns()}")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token)
        try:
            os.link(partial, path)  # never replaces a stored token: a retried submit keeps the first
        except FileExistsError:
            token = path.read_text().strip()
        finally:
            partial.unlink()
        return token

    def read_token(self, name: str) -> str | None:
        try:
            return self._token_path(name).read_text().strip() or None
        except FileNotFoundError:
            return None

    def delete_token(self, name: str) -> None:
        self._token_path(name).unlink(missing_ok=True)

    def job_env(self, token_ref: str) -> dict[str, str]:
        """What a job's command exports for the HTTP channel (none without it)."""
        url = self.metrics_url()  # type: ignore[attr-defined]
        if url is None:
            return {}
        return {"TRIALFLOW_METRICS_URL": url,
                "TRIALFLOW_METRICS_TOKEN_FILE": self.storage.container_path(self.experiment_id, "tokens", token_ref)}

    def shell_command(self, command: list[str], token_ref: str) -> str:
        """``command`` as one shell line, after exporting :meth:`job_env` (every word quoted)."""
        line = " ".join(shlex.quote(word) for word in command)
        env = self.job_env(token_ref)
        if not env:
            return line
        return "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " && " + line


class RestJobService(TokensOnShare, JobPlatformService[ConfigT]):
    logs_on_share = True
    label = ""  # the platform's name in messages

    def __init__(self, config: ConfigT, experiment_dir: Path) -> None:
        self._api: Any = None
        self._last: dict[str, TrialStatus] = {}
        self._ids: dict[str, str] = {}
        self._ids_lock = threading.Lock()
        super().__init__(config, experiment_dir)

    @abstractmethod
    def connect(self) -> Any:
        """The client (a :class:`RestApi`, or the SDK's), ready for calls: credentials set, the base
        URL found."""

    @property
    def api(self) -> Any:
        if self._api is None:
            self._api = self.connect()
        return self._api

    def find_jobs(self, name: str) -> list[tuple[str, str]]:
        """(id, creation time) of every job called ``name``. Platforms whose names are unique keys
        (OpenPAI, Azure ML) address jobs by name and find none this way; the others look them up."""
        return []

    def job_id(self, name: str) -> str | None:
        """The id of the newest job called ``name``, None when there is none."""
        with self._ids_lock:
            if name in self._ids:
                return self._ids[name]
        found = self.find_jobs(name)
        if not found:
            return None
        return self.remember_job_id(name, max(found, key=lambda job: job[1])[0])

    def remember_job_id(self, name: str, job_id: str) -> str:
        with self._ids_lock:
            self._ids[name] = job_id
        return job_id

    def apply_states(self, name: str, state: str, states: dict[str, TrialStatus]) -> TrialStatus:
        """``state`` of job ``name`` through the table ``states`` (see the module docstring)."""
        status = states.get(state)
        if status is None:
            status = self._last.get(name, TrialStatus.WAITING)
            log.info("%s job %s is in state %r, not in the state table; it keeps its previous state %s",
                     self.label, name, state, status.value)
        self._last[name] = status
        return status

    def outcome(self, name: str, state: str, states: dict[str, TrialStatus], why: str | None = None
                ) -> tuple[TrialStatus, str | None]:
        """:meth:`apply_states`, with the message of a failed or stopped job (``why``: the platform's
        reason, when it gives one)."""
        status = self.apply_states(name, state, states)
        reason = f": {why}" if why else ""
        if status == TrialStatus.FAILED:
            return status, f"{self.label} job {name} {state}{reason}"
        if status == TrialStatus.SYS_CANCELED:
            return status, f"{self.label} job {name} was stopped outside trialflow ({state}{reason})"
        return status, None

    def forget_state(self, name: str) -> None:
        self._last.pop(name, None)
        self._restarts.pop(name, None)
        self._ended_by.pop(name, None)

    def close(self) -> None:
        super().close()
        if self._api is not None and callable(getattr(self._api, "close", None)):
            self._api.close()
        self._api = None
