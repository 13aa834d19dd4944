"""A read-only view of an embedded experiment store through the standard library's ``sqlite3``, for the
commands that only read records (``trial ls``, ``experiment export``, ``experiment list``): they skip
SQLAlchemy's import, most of their start-up. It reads the tables that
:mod:`trialflow.records.store_schema` defines, at :data:`~trialflow.records.store_records.SCHEMA_VERSION`
only: any other store (an older one that opening would upgrade, a newer one, a shared PostgreSQL one, one that cannot be
read) is opened as an :class:`~trialflow.records.store.ExperimentStore`, which upgrades it or says in one line
why it cannot.

Lifecycle: :func:`~trialflow.experiments.open_records` returns a reader holding one connection until
:meth:`EmbeddedReader.close`; it writes nothing (SQLite's WAL lets it read while the experiment's controller writes).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any, Protocol

from .store_records import (
    ExperimentRecord,
    Metric,
    TrialRecord,
    experiment_record,
    metric_record,
    store_unreadable,
    trial_record,
)


class RecordSource(Protocol):
    """What the read-only commands read of a store: an :class:`EmbeddedReader` or an
    :class:`~trialflow.records.store.ExperimentStore`."""

    experiment_id: str

    def experiment(self) -> ExperimentRecord: ...

    def trials(self) -> list[TrialRecord]: ...

    def count_trials(self) -> int: ...

    def metrics(self, trial_id: str | None = None, type: str | None = None) -> list[Metric]: ...

    def close(self) -> None: ...


class EmbeddedReader:
    """One experiment's records in its embedded store file, read with ``sqlite3``. A read the database
    refuses raises :class:`~trialflow.records.store_records.StoreUnreadable`, worded as the store words it."""

    def __init__(self, path: Path, experiment_id: str) -> None:
        self.experiment_id = experiment_id
        self.path = path
        self._conn = sqlite3.connect(path, timeout=30, check_same_thread=False)
        self._conn.row_factory = sqlite3.Row

    def _rows(self, sql: str, *args: Any) -> list[sqlite3.Row]:
        try:
            return self._conn.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise store_unreadable(str(self.path), exc, embedded=True) from None

    def schema_version(self) -> int:
        """The store's schema version (0: from before versions were recorded)."""
        tables = self._rows("SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'trialflow_schema'")
        return int(self._rows("SELECT max(version) FROM trialflow_schema")[0][0] or 0) if tables else 0

    def experiment(self) -> ExperimentRecord:
        """Raises KeyError when the file holds no such experiment."""
        rows = self._rows("SELECT * FROM experiments WHERE id = ?", self.experiment_id)
        if not rows:
            raise KeyError(f"experiment {self.experiment_id} is not in its store")
        controls = {k: json.loads(v) for k, v in
                    self._rows("SELECT key, value FROM controls WHERE experiment_id = ?", self.experiment_id)}
        return experiment_record(rows[0], controls)

    def trials(self) -> list[TrialRecord]:
        """The experiment's trials by sequence."""
        return [trial_record(r) for r in self._rows(
            "SELECT * FROM trials WHERE experiment_id = ? ORDER BY sequence", self.experiment_id)]

    def count_trials(self) -> int:
        return int(self._rows("SELECT count(*) FROM trials WHERE experiment_id = ?", self.experiment_id)[0][0])

    def metrics(self, trial_id: str | None = None, type: str | None = None) -> list[Metric]:
        """Metrics ordered by trial, type and sequence: all of them, one trial's, or one type's."""
        sql, args = "SELECT * FROM metrics WHERE experiment_id = ?", [self.experiment_id]
        for column, value in (("trial_id", trial_id), ("type", type)):
            if value is not None:
                sql, args = f"{sql} AND {column} = ?", [*args, value]
        return [metric_record(r) for r in self._rows(f"{sql} ORDER BY trial_id, type, sequence", *args)]

    def close(self) -> None:
        self._conn.close()
