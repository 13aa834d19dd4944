"""An experiment's trials read as they change, for views refreshed while the experiment runs (the live
table of a foreground run, ``trialflow top``, the optuna-dashboard mirror): a refresh costs what changed,
not what exists.

Lifecycle: one :class:`ChangedTrials` (or :class:`KeptTrials`, which keeps every trial as last read) per
view, on a store the view keeps open; ``read`` at each refresh. Not thread-safe: one refreshing thread per
instance.
"""

from __future__ import annotations

import time

from .store import ExperimentStore
from .store_records import TrialRecord

# the slack for a view of a store another process may write from another machine (a shared PostgreSQL
# store, its server's clock): trials whose end it recorded this long before the last read are read again
OTHER_CLOCK_SLACK = 120.0


class ChangedTrials:
    """The first :meth:`read` returns every trial of the store's experiment; each later one the trials
    still active (WAITING, RUNNING) and those submitted, started or ended since the read before, less
    ``slack`` seconds. The times compared are those the trials' controller wrote: ``slack`` covers a
    writer whose clock is not this process's (another machine's), and a trial's later settling (a stop
    that turned out to be its own end) rewrites its end time to that moment, so it is read again."""

    def __init__(self, store: ExperimentStore, slack: float) -> None:
        self.store = store
        self.slack = slack
        self._since: float | None = None  # this clock when the last read began; None: read every trial

    def read(self) -> list[TrialRecord]:
        """The trials that changed since the last read (all of them at the first), by sequence."""
        started = time.time()
        changed = self.store.trials(changed_since=None if self._since is None else self._since - self.slack)
        self._since = started
        return changed


class KeptTrials:
    """Every trial of the store's experiment as of the last :meth:`read`, read again only where it
    changed (:class:`ChangedTrials`, whose ``changed`` it is)."""

    def __init__(self, store: ExperimentStore, slack: float) -> None:
        self.changed = ChangedTrials(store, slack)
        self._by_id: dict[str, TrialRecord] = {}
        self.trials: list[TrialRecord] = []  # as the last read left them, by sequence

    def read(self, everything: bool = False) -> list[TrialRecord]:
        """Every trial, by sequence: those that changed since the last read read again (``everything``:
        all of them read afresh)."""
        fresh = self.changed.store.trials() if everything else self.changed.read()
        self._by_id.update((t.id, t) for t in fresh)
        self.trials = sorted(self._by_id.values(), key=lambda t: t.sequence)
        return self.trials
