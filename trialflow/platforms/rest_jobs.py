"""The base of job platforms spoken to over a REST API -- directly (OpenPAI, DLTS, with
:class:`RestApi`) or through the platform's SDK (PAI-DLC, Azure ML) -- whose secret store and log API
trialflow does not use: metrics tokens live on the share (:class:`TokensOnShare`), a job's logs are
its trial's stdout on the share, and the client is made on first use (:meth:`RestJobService.connect`)
and closed (when it has ``close()``) with the service.

Job ids. Platforms whose job names are not unique keys (DLTS, PAI-DLC) find a job by name with
:meth:`RestJobService.find_jobs`; :meth:`RestJobService.job_id` keeps the newest match per name, so
a retried submit finds the job an earlier attempt created and later calls skip the lookup.

State tables. :meth:`RestJobService.apply_states` applies a platform's table: a state it does not
know keeps the job's previous state (WAITING at first) and is logged, as platforms.md §6 asks; a
state mapped to SYS_CANCELED (a stop) becomes the cancel reason trialflow recorded when it asked for
the stop (:class:`SharedStorageService`'s rule).
"""

from __future__ import annotations

import logging
import threading
from abc import abstractmethod
from pathlib import Path
from typing import Any

from .base import TrialStatus
from .shared_storage import SharedStorageService, TokensOnShare

log = logging.getLogger("trialflow.platforms")


class RestJobService(TokensOnShare, SharedStorageService):
    logs_on_share = True
    label = ""  # the platform's name in messages

    def __init__(self, config: Any, experiment_dir: Path) -> None:
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

    def close(self) -> None:
        super().close()
        if self._api is not None and callable(getattr(self._api, "close", None)):
            self._api.close()
        self._api = None
