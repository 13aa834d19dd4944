"""The experiment store: the source of truth for an experiment's config, trials and metrics.

Embedded by default: one SQLite file per experiment at ``<workdir>/<experiment id>/db/trialflow.sqlite``
(WAL journal, so readers never block the writer and a killed process leaves every committed
record readable). A PostgreSQL URL (``postgresql+psycopg://...``) shares one store between a team.
Both go through SQLAlchemy Core with the same schema.

Guarantees:
* every write is its own transaction: after a SIGKILL, reopening shows every record written before;
* a trial's terminal status is recorded once; later status updates are ignored;
* metrics are unique per (trial, type, sequence): a duplicate from another channel is dropped;
* the store is safe to use from several threads (writes are serialised in-process).
"""

from __future__ import annotations

import importlib
import json
import os
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from ..foundation.status import STOPPED_BY_US, TERMINAL, ExperimentStatus, TrialStatus
from .control_poke import poke
from .store_engine import dumps, embedded_url, open_engine, unreadable_error
from .store_records import (  # noqa: F401 -- the records, SCHEMA_VERSION and StoreUnreadable are the store's to name
    CONTROLLED_FIELDS,
    DB_RELATIVE_PATH,
    SCHEMA_VERSION,
    STOPPING,
    Control,
    ExperimentRecord,
    ImportedItem,
    Metric,
    StoreUnreadable,
    TrialRecord,
    config_in_force,
    experiment_record,
    metric_record,
    store_unreadable,
    trial_record,
)
from .store_schema import (
    controls,
    events,
    experiments,
    imported,
    metrics,
    prepare,
    trials,
    updates,
)

# Hot-path statements, built once: constructing SQLAlchemy statements costs ~10x executing them.
_B = sa.bindparam
_NEXT_SEQUENCE = sa.select(experiments.c.next_sequence).where(experiments.c.id == _B("e"))
_BUMP_SEQUENCE = experiments.update().where(experiments.c.id == _B("e")).values(next_sequence=_B("n"))
_INSERT_TRIAL = trials.insert().values(
    experiment_id=_B("e"), id=_B("t"), sequence=_B("seq"), parameter_id=_B("pid"), parameters=_B("params"),
    raw=_B("raw_values"), status=TrialStatus.WAITING, log_dir=_B("dir"), submit_time=_B("now"))
_INSERT_EVENT = events.insert().values(experiment_id=_B("e"), trial_id=_B("t"), status=_B("new_status"),
                                       time=_B("now"), message=_B("msg"))
_ONE_TRIAL = (trials.c.experiment_id == _B("e")) & (trials.c.id == _B("t"))
_NOT_DONE = trials.c.status.not_in(_B("keep", expanding=True))
_SET_RUNNING = trials.update().where(_ONE_TRIAL, _NOT_DONE).values(status=_B("new_status"), start_time=_B("now"))
_SET_TERMINAL = trials.update().where(_ONE_TRIAL, _NOT_DONE).values(
    status=_B("new_status"), end_time=_B("now"), exit_code=_B("code"), message=_B("msg"))
_SETTLE = trials.update().where(_ONE_TRIAL, trials.c.status.in_(_B("stops", expanding=True))).values(
    status=_B("new_status"), end_time=_B("now"), exit_code=_B("code"), message=_B("msg"))
_SET_START = trials.update().where(_ONE_TRIAL, trials.c.start_time.is_(None)).values(start_time=_B("now"))
_SET_OTHER = trials.update().where(_ONE_TRIAL, _NOT_DONE).values(status=_B("new_status"))
_COUNT_TRIALS = sa.select(sa.func.count()).select_from(trials).where(trials.c.experiment_id == _B("e"))
_TRIAL_EXISTS = sa.select(trials.c.id).where(_ONE_TRIAL)
_ONE_TRIAL_ROW = sa.select(trials).where(_ONE_TRIAL)
_EXPERIMENT_ROW = sa.select(experiments).where(experiments.c.id == _B("e"))
_CONTROLS = sa.select(controls.c.key, controls.c.value).where(controls.c.experiment_id == _B("e"))
_COUNT_BY_STATUS = (sa.select(trials.c.status, sa.func.count()).where(trials.c.experiment_id == _B("e"))
                    .group_by(trials.c.status))
_TRIALS = sa.select(trials).where(trials.c.experiment_id == _B("e")).order_by(trials.c.sequence)
_CHANGED_TRIALS = _TRIALS.where(trials.c.status.not_in(list(TERMINAL)) | (trials.c.end_time >= _B("since"))
                                | (trials.c.submit_time >= _B("since")) | (trials.c.start_time >= _B("since")))
_TRIAL_HANDLE = sa.select(trials.c.handle).where(_ONE_TRIAL)
_SET_HANDLE = trials.update().where(_ONE_TRIAL).values(handle=_B("handle_text"))
_SET_FINAL = trials.update().where(_ONE_TRIAL, trials.c.final.is_(None)).values(final=_B("value_text"))


@dataclass(frozen=True)
class Update:
    """One change of a budget or the search space, as recorded: when, which control, its value, and
    through what (``trialflow update``, ``trialflow resume``, the Python API)."""

    time: float
    control: str
    value: Any
    via: str


class ExperimentStore:
    """One experiment's records in an embedded or shared database."""

    def __init__(self, url: str, experiment_id: str) -> None:
        self.url = url
        self.experiment_id = experiment_id
        self.engine = open_engine(url)
        # the backend's INSERT ... ON CONFLICT (sqlalchemy.dialects.sqlite or .postgresql): only the one in use loads
        self._insert = importlib.import_module(f"sqlalchemy.dialects.{self.engine.dialect.name}").insert
        # RETURNING counts what was new on every backend (psycopg reports no rowcount for these inserts)
        self._insert_metric = self._insert(metrics).on_conflict_do_nothing().returning(metrics.c.sequence)
        self._lock = threading.RLock()
        try:
            prepare(self.engine, url)
            # One connection per store, used under the lock: a pool checkout per statement costs more
            # than the statement itself. Every use is a short transaction, so other processes' writes
            # (the CLI's controls) are seen at once.
            self._conn = self.engine.connect()
        except sa.exc.DBAPIError as exc:
            self.engine.dispose()
            raise unreadable_error(url, exc) from None
        except StoreUnreadable:
            self.engine.dispose()
            raise

    @classmethod
    def embedded(cls, experiment_dir: str | os.PathLike[str], experiment_id: str) -> ExperimentStore:
        return cls(embedded_url(experiment_dir), experiment_id)

    def close(self) -> None:
        with self._lock:
            self._conn.close()
        self.engine.dispose()

    @contextmanager
    def _tx(self) -> Iterator[sa.Connection]:
        """A transaction on the store's connection, committed on exit (serialised in-process)."""
        with self._lock, self._conn.begin():
            yield self._conn

    def _write(self, *statements: Any) -> list[Any]:
        with self._tx() as conn:
            return [conn.execute(s) for s in statements]

    # ---- experiment ---------------------------------------------------------------------

    def create_experiment(self, name: str | None, config: dict[str, Any], config_path: str | None = None,
                          optimize_mode: str | None = None) -> None:
        self._write(experiments.insert().values(
            id=self.experiment_id, name=name, config=dumps(config), config_path=config_path,
            status=ExperimentStatus.INITIALIZED, start_time=time.time(), next_sequence=0, optimize_mode=optimize_mode))

    def experiment(self) -> ExperimentRecord:
        try:
            with self._tx() as conn:
                row = conn.execute(_EXPERIMENT_ROW, {"e": self.experiment_id}).first()
        except sa.exc.DBAPIError as exc:
            raise unreadable_error(self.url, exc) from None
        if row is None:
            raise KeyError(f"experiment {self.experiment_id} is not in the store {self.url}")
        return experiment_record(row._mapping, self.controls())

    def controls(self) -> dict[str, Any]:
        """Runtime changes requested through the CLI (read every loop tick, so kept cheap)."""
        with self._tx() as conn:
            rows = conn.execute(_CONTROLS, {"e": self.experiment_id}).all()
        return {k: json.loads(v) for k, v in rows}

    def set_experiment(self, **values: Any) -> None:
        """Update experiment columns (status, message, end_time, controller_pid, start_time, best_trial,
        pareto (a list, stored as JSON), flow_run_id, prefect_api; config as JSON text)."""
        if values.get("pareto") is not None:
            values["pareto"] = dumps(values["pareto"])
        self._write(experiments.update().where(experiments.c.id == self.experiment_id).values(**values))

    def relocate(self, old_dir: str, new_dir: str) -> None:
        """The experiment folder moved from ``old_dir`` to ``new_dir``: rewrite the trials' stored paths
        (their folders and handles) to match."""
        self._write(trials.update().where(trials.c.experiment_id == self.experiment_id).values(
            log_dir=sa.func.replace(trials.c.log_dir, old_dir, new_dir),
            handle=sa.func.replace(trials.c.handle, old_dir, new_dir)))

    def set_control(self, key: Control, value: Any, via: str | None = None) -> None:
        """A runtime change requested by the CLI or the API (concurrency, max trials, duration, stop);
        with ``via`` (what made it), also an entry of the experiment's update history, in the same
        transaction. A controller watching this store's controls is woken (:mod:`.control_poke`)."""
        text = dumps(value)
        stmt = self._insert(controls).values(experiment_id=self.experiment_id, key=key.value, value=text)
        statements: list[Any] = [stmt.on_conflict_do_update(index_elements=["experiment_id", "key"],
                                                 set_={"value": stmt.excluded.value})]
        if via is not None:
            statements.append(updates.insert().values(experiment_id=self.experiment_id, field=key.value, value=text,
                                                      time=time.time(), via=via))
        self._write(*statements)
        poke(self.url)  # its controller reads its controls now, not at its next look

    def updates(self) -> list[Update]:
        """The experiment's update history, oldest first."""
        with self._tx() as conn:
            rows = conn.execute(sa.select(updates.c.time, updates.c.field, updates.c.value, updates.c.via)
                                .where(updates.c.experiment_id == self.experiment_id).order_by(updates.c.id)).all()
        return [Update(t, f, json.loads(v), via) for t, f, v, via in rows]

    def take_sequence(self) -> int:
        with self._tx() as conn:
            return self._next_sequence(conn)

    def _next_sequence(self, conn: sa.Connection) -> int:
        seq = int(conn.execute(_NEXT_SEQUENCE, {"e": self.experiment_id}).scalar_one())
        conn.execute(_BUMP_SEQUENCE, {"e": self.experiment_id, "n": seq + 1})
        return seq

    # ---- trials -------------------------------------------------------------------------

    def add_trial(self, trial_id: str, sequence: int | None, parameter_id: int, parameters: dict[str, Any],
                  raw: dict[str, Any], log_dir: str | None = None) -> TrialRecord:
        """Add a WAITING trial; ``sequence=None`` takes the next sequence id in the same transaction."""
        now = time.time()
        with self._tx() as conn:
            if sequence is None:
                sequence = self._next_sequence(conn)
            conn.execute(_INSERT_TRIAL, {"e": self.experiment_id, "t": trial_id, "seq": sequence, "pid": parameter_id,
                                         "params": dumps(parameters), "raw_values": dumps(raw), "dir": log_dir,
                                         "now": now})
            conn.execute(_INSERT_EVENT, {"e": self.experiment_id, "t": trial_id, "new_status": TrialStatus.WAITING,
                                         "now": now, "msg": None})
        return TrialRecord(trial_id, sequence, parameter_id, parameters, raw, TrialStatus.WAITING, None, None, None,
                           log_dir, now, None, None)

    def set_handle(self, trial_id: str, handle: dict[str, Any]) -> None:
        self._write(self._trial_update(trial_id).values(handle=dumps(handle)))

    def set_status(self, trial_id: str, status: str, exit_code: int | None = None,
                   message: str | None = None, when: float | None = None) -> bool:
        """Record a status change; False (and nothing written) when the trial is already terminal
        or already has that status."""
        return self._set_status(trial_id, status, exit_code, message, when)

    def record_stop(self, trial_id: str, status: str, message: str) -> bool:
        """Record a stop of ours (USER_CANCELED / EARLY_STOPPED) before its kill, marked
        :attr:`~TrialRecord.stopping` until :meth:`settle`: a controller that dies in between leaves the
        stop for the next one to finish. False (nothing written) when the trial is terminal already.
        Raises KeyError for an unknown trial."""
        return self._set_status(trial_id, status, None, message, None, stopping=True)

    def _set_status(self, trial_id: str, status: str, exit_code: int | None, message: str | None,
                    when: float | None, stopping: bool = False) -> bool:
        now = when or time.time()
        stmt = _SET_RUNNING if status == TrialStatus.RUNNING else _SET_TERMINAL if status in TERMINAL else _SET_OTHER
        params = {"e": self.experiment_id, "t": trial_id, "keep": [*TERMINAL, status], "new_status": status,
                  "now": now, "code": exit_code, "msg": message}
        with self._tx() as conn:
            if conn.execute(stmt, params).rowcount:
                conn.execute(_INSERT_EVENT, params)
                if stopping:  # in the same transaction: a stop is never on record without its mark
                    self._mark_stopping(conn, params, True)
                return True
            exists = conn.execute(_TRIAL_EXISTS, params).first()
        if exists is None:
            raise KeyError(f"trial {trial_id} is not in experiment {self.experiment_id}")
        return False

    def settle(self, trial_id: str, status: str, exit_code: int | None, message: str | None) -> bool:
        """Complete a trial we stopped (recorded USER_CANCELED / EARLY_STOPPED before the kill) once the
        kill is over: its end becomes now (metrics collected after the kill precede it), its exit code
        is kept, and ``status`` replaces the stop when the trial had exited by itself before the kill
        landed; it is no longer :attr:`~TrialRecord.stopping`. False when the trial is not one we stopped."""
        params = {"e": self.experiment_id, "t": trial_id, "stops": list(STOPPED_BY_US), "new_status": status,
                  "now": time.time(), "code": exit_code, "msg": message}
        with self._tx() as conn:
            before = conn.execute(sa.select(trials.c.status).where(_ONE_TRIAL), params).scalar_one_or_none()
            if before not in STOPPED_BY_US or not conn.execute(_SETTLE, params).rowcount:
                return False
            if status != before:
                conn.execute(_INSERT_EVENT, params)
            self._mark_stopping(conn, params, False)
        return True

    @staticmethod
    def _mark_stopping(conn: sa.Connection, params: dict[str, Any], stopping: bool) -> None:
        """Set or clear the trial's :data:`STOPPING` mark, in the caller's transaction."""
        raw = conn.execute(_TRIAL_HANDLE, params).scalar_one_or_none()
        if raw is not None:
            handle = {k: v for k, v in json.loads(raw).items() if k != STOPPING}
            marked = {**handle, STOPPING: True} if stopping else handle
            conn.execute(_SET_HANDLE, {**params, "handle_text": dumps(marked)})

    def set_started(self, trial_id: str, when: float) -> None:
        """Give a trial that ran, but was never seen RUNNING (it ran between two polls), its start time
        ``when`` and a RUNNING event at that time; nothing when it has a start time already."""
        params = {"e": self.experiment_id, "t": trial_id, "now": when, "new_status": TrialStatus.RUNNING, "msg": None}
        with self._tx() as conn:
            if conn.execute(_SET_START, params).rowcount:
                conn.execute(_INSERT_EVENT, params)

    def _trial_update(self, trial_id: str) -> Any:
        return trials.update().where(trials.c.experiment_id == self.experiment_id, trials.c.id == trial_id)

    def trials(self, statuses: Iterable[str] | None = None, changed_since: float | None = None) -> list[TrialRecord]:
        """The experiment's trials by sequence; ``changed_since``: only those still active or submitted,
        started or ended at or after that time (the store's clock)."""
        # built once (a refreshing thread builds no expression: no SQLAlchemy coercion runs there)
        query = _TRIALS if changed_since is None else _CHANGED_TRIALS
        params: dict[str, Any] = {"e": self.experiment_id, "since": changed_since}
        if statuses is not None:
            query = query.where(trials.c.status.in_(list(statuses)))
        with self._tx() as conn:
            rows = conn.execute(query, params).all()
        return [trial_record(r._mapping) for r in rows]

    def count_trials(self) -> int:
        with self._tx() as conn:
            return int(conn.execute(_COUNT_TRIALS, {"e": self.experiment_id}).scalar_one())

    def count_by_status(self) -> dict[str, int]:
        """How many trials are in each status (one grouped query: cheap at any size)."""
        with self._tx() as conn:
            rows = conn.execute(_COUNT_BY_STATUS, {"e": self.experiment_id}).all()
        return {str(status): int(n) for status, n in rows}

    def trial(self, trial_id: str) -> TrialRecord:
        with self._tx() as conn:
            row = conn.execute(_ONE_TRIAL_ROW, {"e": self.experiment_id, "t": trial_id}).first()
        if row is None:
            raise KeyError(f"trial {trial_id} is not in experiment {self.experiment_id}")
        return trial_record(row._mapping)

    def status_history(self, trial_id: str) -> list[tuple[str, float, str | None]]:
        """The trial's recorded events in time order: (status, time, message)."""
        with self._tx() as conn:
            rows = conn.execute(sa.select(events.c.status, events.c.time, events.c.message).where(
                events.c.experiment_id == self.experiment_id, events.c.trial_id == trial_id)
                .order_by(events.c.time, events.c.id)).all()
        return [(r[0], r[1], r[2]) for r in rows]

    # ---- imported data (NNI's importData) --------------------------------------------------

    def add_imported(self, items: list[ImportedItem], source: str | None = None) -> int:
        """Store ``(parameters, raw values, value)`` items in one transaction (all or none); the tuner is
        told them on every (re)start. They are not trials: they count toward no budget and are never
        the best trial. ``source``: where they came from (a warm start's experiment id or file; None
        for NNI's importData)."""
        with self._tx() as conn:
            start = int(conn.execute(sa.select(sa.func.count()).select_from(imported)
                                     .where(imported.c.experiment_id == self.experiment_id)).scalar_one())
            if items:
                conn.execute(imported.insert(), [
                    {"experiment_id": self.experiment_id, "position": start + i, "parameters": dumps(p),
                     "raw": dumps(r), "value": dumps(v), "source": source} for i, (p, r, v) in enumerate(items)])
        return len(items)

    def imported_sources(self) -> dict[str | None, int]:
        """How many imported items came from each source (None: importData), in import order."""
        with self._tx() as conn:
            rows = conn.execute(sa.select(imported.c.source).where(imported.c.experiment_id == self.experiment_id)
                                .order_by(imported.c.position)).scalars().all()
        counts: dict[str | None, int] = {}
        for source in rows:
            counts[source] = counts.get(source, 0) + 1
        return counts

    def imported(self) -> list[ImportedItem]:
        """The imported ``(parameters, raw values, value)`` items, in import order."""
        with self._tx() as conn:
            rows = conn.execute(sa.select(imported.c.parameters, imported.c.raw, imported.c.value)
                                .where(imported.c.experiment_id == self.experiment_id)
                                .order_by(imported.c.position)).all()
        return [(json.loads(p), json.loads(r), json.loads(v)) for p, r, v in rows]

    def note(self, trial_id: str, message: str) -> None:
        """Add an event to the trial's history without changing its status."""
        with self._tx() as conn:
            status = conn.execute(sa.select(trials.c.status).where(_ONE_TRIAL), {"e": self.experiment_id,
                                                                                "t": trial_id}).scalar_one()
            conn.execute(_INSERT_EVENT, {"e": self.experiment_id, "t": trial_id, "new_status": status,
                                         "now": time.time(), "msg": message})

    # ---- metrics ------------------------------------------------------------------------

    def add_metrics(self, records: Iterable[Metric]) -> int:
        """Store metrics; duplicates of (trial, type, sequence) are dropped. Returns how many were new.
        The first FINAL metric of a trial becomes its ``final`` value."""
        rows = [{"experiment_id": self.experiment_id, "trial_id": m.trial_id, "type": m.type, "sequence": m.sequence,
                 "value": dumps(m.value), "time": m.time or time.time()} for m in records]
        if not rows:
            return 0
        stored = 0
        periodical = [r for r in rows if r["type"] != "FINAL"]
        with self._tx() as conn:
            if len(periodical) > 1:  # one executemany: the metric channels deliver in batches
                stored += len(conn.execute(self._insert_metric, periodical).all())
                rows = [r for r in rows if r["type"] == "FINAL"]
            for row in rows:
                inserted = len(conn.execute(self._insert_metric, row).all())
                stored += inserted
                if inserted and row["type"] == "FINAL":
                    conn.execute(_SET_FINAL, {"e": self.experiment_id, "t": row["trial_id"],
                                              "value_text": row["value"]})
        return stored

    def latest_metrics(self, trial_ids: Iterable[str], type: str) -> dict[str, Metric]:
        """The last metric of ``type`` (by sequence) of each of ``trial_ids`` that has one, by trial id."""
        ids = list(trial_ids)
        if not ids:
            return {}
        where = (metrics.c.experiment_id == self.experiment_id, metrics.c.type == type)
        last = (sa.select(metrics.c.trial_id, sa.func.max(metrics.c.sequence).label("sequence"))
                .where(*where, metrics.c.trial_id.in_(ids)).group_by(metrics.c.trial_id).subquery())
        query = sa.select(metrics).join(last, (metrics.c.trial_id == last.c.trial_id)
                                        & (metrics.c.sequence == last.c.sequence)).where(*where)
        with self._tx() as conn:
            return {r.trial_id: metric_record(r._mapping) for r in conn.execute(query)}

    def metrics(self, trial_id: str | None = None, type: str | None = None,
                trial_ids: Iterable[str] | None = None) -> list[Metric]:
        """Metrics ordered by trial, type and sequence: all of them, one trial's, or those of ``trial_ids``."""
        query = sa.select(metrics).where(metrics.c.experiment_id == self.experiment_id)
        if trial_id is not None:
            query = query.where(metrics.c.trial_id == trial_id)
        if trial_ids is not None:
            query = query.where(metrics.c.trial_id.in_(list(trial_ids)))
        if type is not None:
            query = query.where(metrics.c.type == type)
        with self._tx() as conn:
            rows = conn.execute(query.order_by(metrics.c.trial_id, metrics.c.type, metrics.c.sequence)).all()
        return [metric_record(r._mapping) for r in rows]
