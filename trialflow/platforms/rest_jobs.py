"""The base of job platforms spoken to over a REST API that have neither a secret store nor a log API
trialflow uses (OpenPAI, DLTS): metrics tokens live on the share (:class:`TokensOnShare`), a job's
logs are its trial's stdout on the share, and the REST client (:class:`RestApi`) is made on first
use (:meth:`RestJobService.connect`) and closed with the service.

State tables. :meth:`RestJobService.apply_states` applies a platform's table: a state it does not
know keeps the job's previous state (WAITING at first) and is logged, as platforms.md §6 asks; a
state mapped to SYS_CANCELED (a stop) becomes the cancel reason trialflow recorded when it asked for
the stop (:class:`SharedStorageService`'s rule).
"""

from __future__ import annotations

import logging
from abc import abstractmethod
from pathlib import Path
from typing import Any

from .base import TrialStatus
from .rest_api import RestApi
from .shared_storage import SharedStorageService, TokensOnShare

log = logging.getLogger("trialflow.platforms")


class RestJobService(TokensOnShare, SharedStorageService):
    logs_on_share = True
    label = ""  # the platform's name in messages

    def __init__(self, config: Any, experiment_dir: Path) -> None:
        self._api: RestApi | None = None
        self._last: dict[str, TrialStatus] = {}
        super().__init__(config, experiment_dir)

    @abstractmethod
    def connect(self) -> RestApi:
        """The REST client, ready for calls (credentials set, the base URL found)."""

    @property
    def api(self) -> RestApi:
        if self._api is None:
            self._api = self.connect()
        return self._api

    def apply_states(self, name: str, state: str, states: dict[str, TrialStatus]) -> TrialStatus:
        """``state`` of job ``name`` through the table ``states`` (see the module docstring)."""
        status = states.get(state)
        if status is None:
            status = self._last.get(name, TrialStatus.WAITING)
            log.info("%s job %s is in state %r, not in the state table; it keeps its previous state %s",
                     self.label, name, state, status.value)
        self._last[name] = status
        return status

    def forget_state(self, name: str) -> None:
        self._last.pop(name, None)

    def close(self) -> None:
        super().close()
        if self._api is not None:
            self._api.close()
            self._api = None
