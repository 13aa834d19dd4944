"""A cap on trials of one platform across experiments: a Prefect global concurrency limit, created by
us (so it is never silently skipped, as a limit that does not exist would be), whose slots are held
with leases from a trial's submission until its end.

Two nightly sweeps against one PAI-DLC quota set ``platformConcurrency: 3`` and never run more than
three jobs together. Slots are taken without blocking (:meth:`PlatformCap.try_acquire`): the
experiment loop starts a trial only when it got one, so stop and kill requests stay responsive.
Leases are renewed in the background; a killed controller's leases expire after ``LEASE_SECONDS``,
freeing its slots.
"""

from __future__ import annotations

import logging
import threading
from typing import Any
from uuid import UUID

import httpx
from prefect.client.orchestration import get_client

log = logging.getLogger("trialflow.limits")
LEASE_SECONDS = 60.0


class CapNotEnforced(RuntimeError):
    """The server did not count a slot against the cap (the limit is missing): strict, never skipped."""


class PlatformCap:
    """The global concurrency limit ``name`` with ``slots`` slots; one lease per running trial."""

    def __init__(self, name: str, slots: int, lease_seconds: float = LEASE_SECONDS) -> None:
        self.name = name
        self.slots = slots
        self.lease_seconds = lease_seconds
        self._client: Any = get_client(sync_client=True)
        self._client.__enter__()
        self._leases: dict[str, UUID] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._renewer = threading.Thread(target=self._renew, name=f"lease-renewer-{name}", daemon=True)

    def ensure(self) -> PlatformCap:
        """Create the limit when it is missing and start renewing leases. A limit that exists keeps its
        slots, also when they differ from ``slots`` (an operator may have changed them in Prefect): a
        warning says so. Experiments starting together may both find no limit and both create it: the
        one that loses takes the winner's."""
        from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
        from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

        try:
            existing = self._client.read_global_concurrency_limit_by_name(self.name)
        except ObjectNotFound:
            try:
                self._client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=self.name,
                                                                                           limit=self.slots))
                existing = None
            except ObjectAlreadyExists:
                existing = self._client.read_global_concurrency_limit_by_name(self.name)
        if existing is not None and existing.limit != self.slots:
            log.warning("platformConcurrency is %d but Prefect's global concurrency limit %r has %d slots (changed "
                        "there?): it keeps them; `prefect gcl update %s --limit %d` applies the config's",
                        self.slots, self.name, existing.limit, self.name, self.slots)
        self._renewer.start()
        return self

    def try_acquire(self, trial_id: str) -> bool:
        """Take a slot for ``trial_id``; False when all are taken (the caller tries again later)."""
        try:
            response = self._client.increment_concurrency_slots_with_lease(
                names=[self.name], slots=1, mode="concurrency", lease_duration=self.lease_seconds)
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code == 423:  # locked: no free slot
                return False
            raise
        body = response.json()
        if not any(limit.get("name") == self.name for limit in body.get("limits", [])):
            raise CapNotEnforced(f"the Prefect server does not know the global concurrency limit {self.name!r}; "
                                 "it was deleted while the experiment ran: create it again with "
                                 f"`prefect gcl create {self.name} --limit {self.slots}`")
        with self._lock:
            self._leases[trial_id] = UUID(body["lease_id"])
        return True

    def rename(self, old: str, new: str) -> None:
        """Hand the slot taken as ``old`` to ``new`` (a slot is taken before the trial has its id)."""
        with self._lock:
            if old in self._leases:
                self._leases[new] = self._leases.pop(old)

    def release(self, trial_id: str) -> None:
        with self._lock:
            lease = self._leases.pop(trial_id, None)
        if lease is not None:
            try:
                self._client.release_concurrency_slots_with_lease(lease)
            except httpx.HTTPError as exc:  # the lease expires by itself after lease_seconds
                log.warning("slot of trial %s on %s not released (%s); it frees itself within %.0f s",
                            trial_id, self.name, exc, self.lease_seconds)

    def _renew(self) -> None:
        while not self._stop.wait(self.lease_seconds / 3):
            with self._lock:
                leases = list(self._leases.items())
            for trial_id, lease in leases:
                try:
                    self._client.renew_concurrency_lease(lease, self.lease_seconds)
                except httpx.HTTPError as exc:
                    log.warning("lease of trial %s on %s not renewed: %s", trial_id, self.name, exc)

    def close(self) -> None:
        """Release every slot still held and stop renewing."""
        self._stop.set()
        for trial_id in list(self._leases):
            self.release(trial_id)
        self._client.__exit__(None, None, None)
