"""The experiment store's tables and their numbered versions.

:data:`~trialflow.records.store_records.SCHEMA_VERSION` numbers the tables below. A store records the version it
was written at in ``trialflow_schema`` (stores from before the number read as 0). Opening a store runs every upgrade
step from its version up to :data:`SCHEMA_VERSION`, one step per version, in one transaction that
holds the store's write lock (PostgreSQL: an advisory lock; SQLite: the database's write lock), so
two processes opening an old store at once upgrade it once; each step is idempotent as well. A store
newer than this code is refused in one line naming both versions.

A change to the tables bumps :data:`SCHEMA_VERSION`, adds its step to :data:`STEPS`, and adds a store
written by the new code to ``tests/assets/stores/`` (``scripts/write_store_asset.py``), which the
upgrade test opens with every later version.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url

from .store_records import SCHEMA_VERSION, StoreUnreadable

_meta = sa.MetaData()
experiments = sa.Table(
    "experiments", _meta,
    sa.Column("id", sa.String(16), primary_key=True),
    sa.Column("name", sa.Text),
    sa.Column("config", sa.Text, nullable=False),
    sa.Column("config_path", sa.Text),
    sa.Column("status", sa.String(24), nullable=False),
    sa.Column("message", sa.Text),
    sa.Column("start_time", sa.Float),
    sa.Column("end_time", sa.Float),
    sa.Column("controller_pid", sa.Integer),
    sa.Column("next_sequence", sa.Integer, nullable=False, default=0),
    sa.Column("optimize_mode", sa.String(8)),  # decided once at creation (``trialflow.experiments.results``)
    sa.Column("best_trial", sa.String(16)),  # recorded when the experiment ends
    sa.Column("pareto", sa.Text),  # a multi-objective experiment's Pareto set (JSON trial ids), recorded at its end
    sa.Column("flow_run_id", sa.String(64)),  # the Prefect flow run of its latest run
    sa.Column("prefect_api", sa.Text),  # that run's API (None: Prefect's temporary server)
)
controls = sa.Table(
    "controls", _meta,
    sa.Column("experiment_id", sa.String(16), primary_key=True),
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
)
trials = sa.Table(
    "trials", _meta,
    sa.Column("experiment_id", sa.String(16), primary_key=True),
    sa.Column("id", sa.String(16), primary_key=True),
    sa.Column("sequence", sa.Integer, nullable=False),
    sa.Column("parameter_id", sa.Integer, nullable=False),
    sa.Column("parameters", sa.Text, nullable=False),
    sa.Column("raw", sa.Text, nullable=False),
    sa.Column("status", sa.String(24), nullable=False),
    sa.Column("handle", sa.Text),
    sa.Column("exit_code", sa.Integer),
    sa.Column("message", sa.Text),
    sa.Column("log_dir", sa.Text),
    sa.Column("submit_time", sa.Float, nullable=False),
    sa.Column("start_time", sa.Float),
    sa.Column("end_time", sa.Float),
    sa.Column("final", sa.Text),
)
events = sa.Table(
    "trial_events", _meta,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("experiment_id", sa.String(16), nullable=False),
    sa.Column("trial_id", sa.String(16), nullable=False),
    sa.Column("status", sa.String(24), nullable=False),
    sa.Column("time", sa.Float, nullable=False),
    sa.Column("message", sa.Text),
)
imported = sa.Table(  # NNI's importData and warm starts: told to the tuner, never trials of the experiment
    "imported_data", _meta,
    sa.Column("experiment_id", sa.String(16), primary_key=True),
    sa.Column("position", sa.Integer, primary_key=True),
    sa.Column("parameters", sa.Text, nullable=False),
    sa.Column("raw", sa.Text, nullable=False),
    sa.Column("value", sa.Text, nullable=False),
    sa.Column("source", sa.Text),  # (2) where the item came from: an experiment id or a file; None: importData
)
updates = sa.Table(  # (2) every change of a budget or the search space, as made: the history ``show`` prints
    "experiment_updates", _meta,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("experiment_id", sa.String(16), nullable=False),
    sa.Column("field", sa.String(64), nullable=False),
    sa.Column("value", sa.Text, nullable=False),
    sa.Column("time", sa.Float, nullable=False),
    sa.Column("via", sa.String(32), nullable=False),
)
schema = sa.Table(  # one row: the schema version of the store's tables
    "trialflow_schema", _meta,
    sa.Column("version", sa.Integer, nullable=False),
)
metrics = sa.Table(
    "metrics", _meta,
    sa.Column("experiment_id", sa.String(16), primary_key=True),
    sa.Column("trial_id", sa.String(16), primary_key=True),
    sa.Column("type", sa.String(16), primary_key=True),
    sa.Column("sequence", sa.Integer, primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
    sa.Column("time", sa.Float, nullable=False),
)


# ---- upgrade steps: STEPS[n] brings a store at version n - 1 to version n ---------------------------

def _add_missing_columns(conn: sa.Connection, table: sa.Table) -> None:
    present = {c["name"] for c in sa.inspect(conn).get_columns(table.name)}
    for column in table.columns:
        if column.name not in present:  # nullable: rows written before keep None
            conn.exec_driver_sql(f"ALTER TABLE {table.name} ADD COLUMN {column.name} "
                                 f"{column.type.compile(conn.dialect)}")


def _to_1(conn: sa.Connection) -> None:
    """The experiment columns added before the schema was numbered (optimize mode, best trial, the
    Prefect run and API)."""
    _add_missing_columns(conn, experiments)


def _to_2(conn: sa.Connection) -> None:
    """Where an imported item came from (warm starts), and the history of budget and space updates."""
    _add_missing_columns(conn, imported)
    updates.create(conn, checkfirst=True)


def _to_3(conn: sa.Connection) -> None:
    """A multi-objective experiment's Pareto set, recorded at its end."""
    _add_missing_columns(conn, experiments)


STEPS: dict[int, Callable[[sa.Connection], None]] = {1: _to_1, 2: _to_2, 3: _to_3}
assert sorted(STEPS) == list(range(1, SCHEMA_VERSION + 1)), "one upgrade step per schema version"

SCHEMA_ATTEMPTS = 5
RACE_ERRORS = ("already exists", "duplicate", "database is locked")  # what two creators of one store meet
_UPGRADE_LOCK = 0x7472_6961_6c66  # PostgreSQL advisory lock key of trialflow's upgrades ("trialf")


def prepare(engine: Engine, url: str) -> None:
    """Create a new store's tables at :data:`SCHEMA_VERSION`, or upgrade an older store's. Another
    process may do the same at the same moment (``create`` while ``experiment list``, a dashboard or
    the controller opens the new store): the loser of a creation race meets "table already exists", a
    duplicate type, or SQLite's "database is locked" (switching a new file to WAL does not wait), and
    its next try finds the work done; upgrades wait for the store's write lock. Raises
    :class:`StoreUnreadable` for a store newer than this code; any other database error (a damaged
    file, an unreachable server) is raised as it is, as is the race's after the last try."""
    for attempt in range(1, SCHEMA_ATTEMPTS + 1):
        try:
            if not _has_tables(engine):
                _meta.create_all(engine)
            _upgrade(engine, url)
            return
        except sa.exc.DBAPIError as exc:
            reason = str(exc.orig).lower()
            if attempt == SCHEMA_ATTEMPTS or not any(race in reason for race in RACE_ERRORS):
                raise
            time.sleep(0.02 * attempt)  # racers that lost together retry apart


def _has_tables(engine: Engine) -> bool:
    with engine.connect() as conn:
        return sa.inspect(conn).has_table(experiments.name)


def _version(conn: sa.Connection) -> int:
    if not sa.inspect(conn).has_table(schema.name):
        return 0
    return int(conn.execute(sa.select(sa.func.max(schema.c.version))).scalar() or 0)


def _upgrade(engine: Engine, url: str) -> None:
    """Run the steps from the store's version to :data:`SCHEMA_VERSION` under the store's write lock,
    reading the version again once it holds the lock (another process may have upgraded it)."""
    with engine.connect() as conn:
        found = _version(conn)
    _refuse_newer(found, url)
    if found == SCHEMA_VERSION:
        return
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _UPGRADE_LOCK})
        else:  # a write takes SQLite's database lock until the commit; other writers wait (busy_timeout)
            schema.create(conn, checkfirst=True)
            conn.execute(schema.update().values(version=schema.c.version))
        found = _version(conn)
        _refuse_newer(found, url)
        # tables the store lacks, whole (an old store never had them; a new one's creator, racing this
        # process, may not have made them yet), then the steps bring the tables it had up to date
        _meta.create_all(conn)
        for version in range(found + 1, SCHEMA_VERSION + 1):
            STEPS[version](conn)
        conn.execute(schema.delete())
        conn.execute(schema.insert().values(version=SCHEMA_VERSION))


def _refuse_newer(found: int, url: str) -> None:
    if found > SCHEMA_VERSION:
        raise StoreUnreadable(f"the experiment store {where(url)} was written by a newer trialflow (store schema "
                              f"{found}; this trialflow reads up to {SCHEMA_VERSION}): upgrade trialflow "
                              "(pip install -U trialflow) to open it")


def where(url: str) -> str:
    """The store's file, or its database URL without the password."""
    return url.split("///", 1)[-1] if url.startswith("sqlite") else make_url(url).render_as_string(hide_password=True)
