"""The kept server's writes of event batches to SQLite, as parameter sets of a one-row statement.

Prefect's server stores each batch of events, their resources and its task runs' states as one
multi-row ``INSERT ... VALUES (...), (...), ...``. SQLAlchemy compiles such a statement anew for every
batch (its text depends on the number of rows): a large share of the server's CPU while an experiment
runs (benchmarks/README.md). :func:`write_batches_as_parameter_sets` makes this process's Prefect
server send the same rows as parameter sets of one statement per table (``executemany``), whose text
is one row's whatever the batch's size, so compiling it costs little: the same rows land, with the same
defaults, duplicates skipped alike.

Lifecycle: called once in the kept server's process, before its app starts; it changes Prefect's
server modules for that process only. Where this Prefect lacks one of the functions replaced, that
one is left as Prefect has it.
"""

from __future__ import annotations

from typing import Any

from .prefect_replacement import replace_in_prefect

EVENT_STORAGE = "prefect.server.events.storage.database"
TASK_RUN_RECORDER = "prefect.server.services.task_run_recorder"


def write_batches_as_parameter_sets() -> list[str]:
    """Replace Prefect's SQLite writers of events and task-run states in this process; the names of
    those replaced (none where this Prefect has neither)."""
    writers = ((EVENT_STORAGE, "_write_sqlite_events", lambda _, module: _events_writer(module._in_safe_batches)),
               (TASK_RUN_RECORDER, "_insert_task_run_states", lambda _, module: _task_run_states_writer()))
    return [f"{module}.{name}" for module, name, make in writers if replace_in_prefect(module, name, make)]


def _events_writer(batches: Any) -> Any:
    import sqlalchemy as sa
    from prefect.server.database import provide_database_interface

    async def write_sqlite_events(session: Any, events: list[Any]) -> None:
        """Prefect's ``_write_sqlite_events``: events whose id is stored already are skipped."""
        db = provide_database_interface()
        for batch in batches(events):
            stored = set((await session.scalars(
                sa.select(db.Event.id).where(db.Event.id.in_({event.id for event in batch})))).all())
            new = [event for event in batch if event.id not in stored]
            if not new:
                continue
            await session.execute(db.queries.insert(db.Event), [event.as_database_row() for event in new])
            resources = [row for event in new for row in event.as_database_resource_rows()]
            if resources:
                await session.execute(db.queries.insert(db.EventResource), resources)

    return write_sqlite_events


def _task_run_states_writer() -> Any:
    import prefect.types._datetime
    from prefect.server.database import provide_database_interface

    async def insert_task_run_states(session: Any, task_runs: list[Any]) -> None:
        """Prefect's ``_insert_task_run_states``: a state whose id is stored already is skipped."""
        if not task_runs:
            return
        db = provide_database_interface()
        now = prefect.types._datetime.now("UTC")
        rows = [{"created": now, "task_run_id": run.id, **run.state.model_dump()} for run in task_runs]
        await session.execute(db.queries.insert(db.TaskRunState).on_conflict_do_nothing(index_elements=["id"]),
                              rows)

    return insert_task_run_states
