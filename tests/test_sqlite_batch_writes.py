"""The kept server's writers of event batches and task-run states store what Prefect's own store.

Each test runs a child interpreter on a throwaway SQLite database (Prefect's server keeps its database
interface for the whole process): the same batches go through Prefect's writer and through
:mod:`trialflow.server.sqlite_batch_writes`'s, one after the other on an emptied table, and the child
prints the stored rows of each as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import asyncio, json, sys, uuid
    import sqlalchemy as sa
    from prefect.server.database import provide_database_interface
    from prefect.server.events.schemas.events import ReceivedEvent
    from prefect.server.events.storage import database as storage
    from prefect.server.models import task_runs as task_run_models
    from prefect.server.schemas import actions, core, states
    from prefect.server.services import task_run_recorder
    from trialflow.server import sqlite_batch_writes as ours

    def event(number, follows=None):
        run = uuid.UUID(int=number)
        return ReceivedEvent(
            id=uuid.UUID(int=1000 + number), occurred="2026-12-05T10:00:00+00:00", event="prefect.task-run.Running",
            resource={"prefect.resource.id": f"prefect.task-run.{run}", "prefect.resource.name": f"trial-{number}"},
            related=[{"prefect.resource.id": "prefect.flow-run.1", "prefect.resource.role": "flow-run",
                      "prefect.resource.name": "run"}]
                    + [{"prefect.resource.id": f"prefect.tag.t{k}", "prefect.resource.role": "tag"}
                       for k in range(number % 4)],
            payload={"number": number, "values": [1.5, None, "x"]}, follows=follows)

    async def rows(session, query):
        return sorted([[str(value) for value in row] for row in (await session.execute(sa.text(query))).all()])

    FIRST = [event(n) for n in range(1, 6)]
    AGAIN = FIRST[2:] + [event(n, follows=uuid.UUID(int=1001)) for n in range(6, 9)]  # 3 stored already

    async def events(db, writer):
        for batch in (FIRST, AGAIN, []):
            async with db.session_context(begin_transaction=True) as session:
                await writer(session, batch)
        async with db.session_context(begin_transaction=True) as session:
            found = {
                "events": await rows(session, "select id, occurred, event, resource_id, resource, related_resource_ids,"
                                              " related, payload, follows, received from events"),
                "resources": await rows(session, "select event_id, occurred, resource_id, resource_role, resource"
                                                 " from event_resources"),
            }
            await session.execute(sa.text("delete from event_resources"))
            await session.execute(sa.text("delete from events"))
        return found

    async def task_run_states(db, writer, task_run_id):
        def run(state):
            return core.TaskRun(id=task_run_id, flow_run_id=None, task_key="k", dynamic_key="0", state=state)
        running = states.State(id=uuid.UUID(int=7), type="RUNNING", name="Running",
                               timestamp="2026-12-05T10:00:01+00:00", message="started")
        done = states.State(id=uuid.UUID(int=8), type="COMPLETED", timestamp="2026-12-05T10:00:02+00:00")
        for batch in ([run(running)], [run(running), run(done)]):  # the running state stored already
            async with db.session_context(begin_transaction=True) as session:
                await writer(session, batch)
        async with db.session_context(begin_transaction=True) as session:
            found = await rows(session, "select id, task_run_id, type, timestamp, name, message, state_details, data"
                                        " from task_run_state")
            await session.execute(sa.text("delete from task_run_state"))
        return found

    async def main():
        db = provide_database_interface()
        if sys.argv[2] == "new":  # else a copy of the run's migrated empty database
            await db.create_db()
        async with db.session_context(begin_transaction=True) as session:
            task_run = await task_run_models.create_task_run(
                session, actions.TaskRunCreate(task_key="k", dynamic_key="0", name="t"))
        kind = sys.argv[1]
        if kind == "events":
            writers = {"prefect": storage._write_sqlite_events, "ours": ours._events_writer(storage._in_safe_batches)}
            out = {name: await events(db, writer) for name, writer in writers.items()}
        else:
            writers = {"prefect": task_run_recorder._insert_task_run_states, "ours": ours._task_run_states_writer()}
            out = {name: await task_run_states(db, writer, task_run.id) for name, writer in writers.items()}
        print(json.dumps(out))

    asyncio.run(main())
""")


def _stored_by_each(kind: str, tmp_path) -> dict:
    """What Prefect's writer and ours store of the same batches, on a migrated database: a copy of the
    run's migrated empty one where a server of the run made it (the migration is most of the CPU), else
    a new one that the child migrates."""
    from trialflow.server.prefect_db_template import prefect_version, seed

    database = tmp_path / "prefect.db"
    seeded = seed(database, prefect_version())
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"),
           "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{database}"}
    done = subprocess.run([sys.executable, "-c", CHILD, kind, "seeded" if seeded else "new"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_event_batches_are_stored_as_prefects_writer_stores_them_and_stored_ones_are_skipped(tmp_path):
    stored = _stored_by_each("events", tmp_path)
    assert len(stored["prefect"]["events"]) == 8  # 5, then 3 new of 6 (3 stored already), then none
    assert len(stored["prefect"]["resources"]) == sum(1 + 1 + n % 4 for n in range(1, 9))
    assert stored["ours"] == stored["prefect"]


def test_task_run_states_are_stored_as_prefects_writer_stores_them_and_a_stored_one_is_skipped(tmp_path):
    stored = _stored_by_each("states", tmp_path)
    assert [row[2] for row in stored["prefect"]] == ["RUNNING", "COMPLETED"]
    assert stored["ours"] == stored["prefect"]


def test_only_the_kept_servers_process_gets_the_writers(tmp_path):
    """The replacement happens where the kept server's app is created, in its process, and names what it
    replaced; importing trialflow's server modules elsewhere changes nothing of Prefect's."""
    code = textwrap.dedent("""
        import trialflow.server.kept_server_app
        from prefect.server.events.storage import database as storage
        from prefect.server.services import task_run_recorder
        before = (storage._write_sqlite_events, task_run_recorder._insert_task_run_states)
        from trialflow.server.sqlite_batch_writes import write_batches_as_parameter_sets
        print(sorted(write_batches_as_parameter_sets()))
        print(before[0] is not storage._write_sqlite_events, before[1] is not task_run_recorder._insert_task_run_states)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PREFECT_HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    names, changed = done.stdout.strip().splitlines()
    assert names == str(["prefect.server.events.storage.database._write_sqlite_events",
                         "prefect.server.services.task_run_recorder._insert_task_run_states"])
    assert changed == "True True"
