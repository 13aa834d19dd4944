"""The kept server's app runs a request that met a busy SQLite again inside the server, so the client
never waits out its 2 s back-off for it. Checked on a Starlette app that fails as Prefect's server does
(an exception handler answers 503, then Starlette raises the error again for the server's log). And the
garbage collector, paused for the server's start, runs again once the start has settled; Prefect's loop
services are scheduled only seconds after the start, and never for a server stopped before then."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import sqlite3
import subprocess
import sys
import time
import weakref

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Mount, Route

from trialflow.server.kept_server_app import (
    LOCK_WAIT_MS,
    REPLAYS,
    CollectorResumedAfterStart,
    LoopServicesAfterStart,
    ReplayBusyWrites,
)


def _app(busy_times: int, seen: list[bytes], status_when_failing: int = 503) -> Starlette:
    async def create(request: Request) -> PlainTextResponse:
        seen.append(await request.body())
        if len(seen) <= busy_times:
            raise sqlite3.OperationalError("database is locked")
        return PlainTextResponse("created " + (await request.body()).decode(), status_code=201)

    async def answer(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"exception_message": "Service Unavailable"}, status_code=status_when_failing)

    # mounted under /api as Prefect's API is: routing rewrites the scope it is given
    return Starlette(routes=[Mount("/api", routes=[Route("/flow_runs/", create, methods=["POST"])])],
                     exception_handlers={Exception: answer})


def _post(app: Starlette) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=ReplayBusyWrites(app), raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://server") as client:
            return await client.post("/api/flow_runs/", content=b'{"name": "x"}')
    return asyncio.run(go())


def test_a_write_that_met_a_busy_database_is_run_again_with_its_body_and_succeeds():
    seen: list[bytes] = []
    response = _post(_app(busy_times=2, seen=seen))
    assert response.status_code == 201
    assert response.text == 'created {"name": "x"}'
    assert seen == [b'{"name": "x"}'] * 3  # every try got the whole body


def test_a_database_busy_for_longer_reaches_the_client_as_503_after_the_tries():
    seen: list[bytes] = []
    response = _post(_app(busy_times=100, seen=seen))
    assert response.status_code == 503  # the client's own back-off takes over
    assert response.json() == {"exception_message": "Service Unavailable"}
    assert len(seen) == REPLAYS


@pytest.mark.parametrize("status", [500, 404])
def test_other_failures_are_answered_once(status):
    seen: list[bytes] = []
    response = _post(_app(busy_times=1, seen=seen, status_when_failing=status))
    assert response.status_code == status
    assert len(seen) == 1


class _Cycle:
    """Garbage only the cyclic collector frees: an object that refers to itself."""

    def __init__(self) -> None:
        self.me = self


def _start(outcome: str, settle: float) -> tuple[bool, bool, bool, bool]:
    """Run a lifespan start-up reporting ``outcome`` through CollectorResumedAfterStart with the collector
    paused, an object kept and a cycle dropped during it; (collector running right after the report,
    running ``settle`` + 0.1 s later, the kept object set aside from later collections, the dropped
    cycle freed)."""
    kept: list[_Cycle] = []
    dropped: list[weakref.ref] = []

    async def app(scope, receive, send):
        await receive()  # lifespan.startup
        kept.append(_Cycle())  # lives on, as the app's objects do
        dropped.append(weakref.ref(_Cycle()))  # the start's garbage
        await send({"type": f"lifespan.startup.{outcome}"})

    async def go() -> tuple[bool, bool]:
        messages = [{"type": "lifespan.startup"}]

        async def receive():
            return messages.pop(0)

        async def send(message):
            pass

        await CollectorResumedAfterStart(app, settle=settle)({"type": "lifespan"}, receive, send)
        right_after = gc.isenabled()
        await asyncio.sleep(settle + 0.1)
        return right_after, gc.isenabled()

    gc.unfreeze()  # none set aside before
    gc.collect()
    gc.disable()
    try:
        running = asyncio.run(go())
        # a set-aside object is in the permanent generation, which the collector's lists leave out
        set_aside = gc.get_freeze_count() > 0 and not any(o is kept[0] for o in gc.get_objects())
        return running + (set_aside, dropped[0]() is None)
    finally:
        gc.unfreeze()  # this process's objects back to the collector
        gc.enable()


def test_the_collector_paused_for_a_server_start_runs_again_once_it_settled_past_the_starts_objects():
    """The collector runs again after the settle time; what the start left alive is set aside from later
    collections, and what it dropped is freed, not set aside."""
    assert _start("complete", settle=0.3) == (False, True, True, True)


def _printed_by(code: str, prefect_home, **env: str) -> list[str]:
    """The words ``code`` prints, run in a fresh interpreter (Prefect's app cache and this process's
    collector untouched) with its own ``PREFECT_HOME`` and ``env``; it must exit 0."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PREFECT_HOME": str(prefect_home), **env})
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_the_kept_servers_app_is_created_without_a_full_collection_where_fastapi_copies_no_routes(tmp_path):
    """Prefect's "final" app ends its creation with a full collection, there to free routes an older
    FastAPI copied; with one that copies none it frees nothing and delays the first answer of every
    start. The kept server asks for it only where FastAPI copies routes, also when the environment
    sets Prefect's switch for it (as the kept server's own start once did)."""
    created = ("import gc\n"
               "full = []\n"
               "gc.callbacks.append(lambda phase, info: full.append(1) if phase == 'start' and "
               "info['generation'] == 2 else None)\n"
               "from trialflow.server.kept_server_app import create_app\n"
               "create_app(port=4321)\n"
               "import prefect.server.api.server as server\n"
               "print(server._FASTAPI_COPIES_ROUTES_ON_INCLUDE, len(full))\n")
    assert _printed_by(created, tmp_path, PREFECT__SERVER_FINAL="1") == ["False", "0"]


def test_prefects_in_process_clients_get_the_kept_servers_app_without_hashing_settings_or_logging_again(tmp_path):
    """Prefect's services make API clients inside the server process, each calling Prefect's
    ``create_app()``, which hashed every setting and set logging up again before returning the app from
    its cache (~0.12 s of CPU each, right after every start). In the kept server they get that app at
    once; a call with settings of its own still goes to Prefect."""
    created = ("from trialflow.server.kept_server_app import create_app\n"
               "create_app(port=4321)\n"
               "import prefect.logging.configuration as logging_setup\n"
               "import prefect.server.api.server as server\n"
               "calls = []\n"
               "real = logging_setup.setup_logging\n"
               "logging_setup.setup_logging = lambda *a, **k: (calls.append(1), real(*a, **k))[1]\n"
               "(made,) = server.APP_CACHE.values()\n"
               "from prefect.server.api.clients import OrchestrationClient\n"
               "OrchestrationClient()\n"
               "print(server.create_app() is made, len(calls))\n"
               "from prefect.settings import get_current_settings\n"
               "server.create_app(settings=get_current_settings())\n"
               "print(len(calls))\n")
    assert _printed_by(created, tmp_path) == ["True", "0", "1"]


def test_prefects_background_worker_looks_for_due_work_once_a_second_and_runs_work_added_now_at_once(tmp_path):
    """The worker that runs Prefect's background tasks (its loop services' steps among them) looked for
    due work four times a second, idle or not, each look a few in-memory Redis calls (an idle kept
    server spent a quarter more CPU so than at one look a second). In the kept server it looks once a
    second; work added to run now still starts at once, not at the next look (here a look every 30 s)."""
    looked = ("import asyncio, time\n"
              "from trialflow.server.kept_server_app import check_background_work_every, create_app\n"
              "create_app(port=4321)\n"
              "import docket.worker\n"
              "from docket import Docket\n"
              "from prefect.server.api import background_workers\n"
              "looks, ran = [], []\n"
              "look = docket.worker._stream_due_tasks\n"
              "async def counted(*args, **kwargs):\n"
              "    looks.append(1)\n"
              "    return await look(*args, **kwargs)\n"
              "docket.worker._stream_due_tasks = counted\n"
              "async def now():\n"
              "    ran.append(time.monotonic())\n"
              "async def idle_then_add(name, idle):\n"
              "    async with Docket(name=name, url='memory://') as tasks:\n"
              "        tasks.register(now)\n"
              "        async with background_workers.Worker(tasks) as worker:\n"
              "            running = asyncio.create_task(worker.run_forever())\n"
              "            await asyncio.sleep(idle)\n"
              "            added = time.monotonic()\n"
              "            await tasks.add(now)()\n"
              "            while not ran:\n"
              "                await asyncio.sleep(0.01)\n"
              "            running.cancel()\n"
              "            return ran.pop() - added\n"
              "asyncio.run(idle_then_add('idle', 3.0))\n"
              "print(len(looks))\n"
              "check_background_work_every(30.0)\n"
              "print(asyncio.run(idle_then_add('slow', 1.0)) < 15)\n")
    looks, at_once = _printed_by(looked, tmp_path)
    assert 1 <= int(looks) <= 4  # docket's own pace: 12 or more in 3 s
    assert at_once == "True"


def test_a_write_waits_seconds_not_a_minute_for_sqlites_lock_in_the_kept_server(tmp_path):
    """Prefect has SQLite wait up to 60 s for the write lock. Only the kept server writes its database, so
    such a wait is the server waiting on itself, and with four test workers on one server every call
    stalled a minute. In the kept server a write meeting the lock fails after LOCK_WAIT_MS (then run
    again), and a write that waited for a lock held a moment still goes through."""
    locked = ("import asyncio, os, sqlite3, threading, time\n"
              "from trialflow.server.kept_server_app import create_app\n"
              "create_app(port=4321)\n"
              "import sqlalchemy as sa\n"
              "from prefect.server.database.configurations import AioSqliteConfiguration\n"
              "path = os.environ['DB']\n"
              "holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)\n"
              "holder.execute('create table t (x)')\n"
              "async def write():\n"
              "    engine = await AioSqliteConfiguration('sqlite+aiosqlite:///' + path).engine()\n"
              "    async with engine.connect() as conn:\n"
              "        print((await conn.execute(sa.text('PRAGMA busy_timeout'))).scalar())\n"
              "        holder.execute('BEGIN IMMEDIATE')\n"
              "        began = time.monotonic()\n"
              "        try:\n"
              "            await conn.execute(sa.text('insert into t values (1)'))\n"
              "        except sa.exc.OperationalError as exc:\n"
              "            print('locked' in str(exc), time.monotonic() - began)\n"
              "        await conn.rollback()\n"
              "        threading.Timer(0.5, holder.execute, ('COMMIT',)).start()\n"
              "        await conn.execute(sa.text('insert into t values (2)'))\n"
              "        await conn.commit()\n"
              "    await engine.dispose()\n"
              "asyncio.run(write())\n"
              "print(holder.execute('select x from t').fetchall() == [(2,)])\n")
    timeout, failed, waited, written = _printed_by(locked, tmp_path, DB=str(tmp_path / "prefect.db"))
    assert (int(timeout), failed, written) == (LOCK_WAIT_MS, "True", "True")
    assert LOCK_WAIT_MS / 1000 - 0.5 <= float(waited) < 30  # ended by the timeout, long before Prefect's 60 s


def test_the_collector_runs_again_at_once_when_the_start_failed():
    running_right_after, running_later, set_aside, _ = _start("failed", settle=5.0)
    assert (running_right_after, running_later, set_aside) == (True, True, False)


def _serve(outcome: str, delay: float, shutdown_after: float, step=None,
           linger: float = 0.0) -> tuple[list[str], list[float]]:
    """Run a lifespan through LoopServicesAfterStart around an app that, as Prefect's does, schedules its
    loop services (``step``, held) during its start-up and reports ``outcome``; shutdown is asked
    ``shutdown_after`` seconds after the start-up; the loop runs on ``delay`` or ``linger`` seconds more,
    whichever is longer. (What the app saw, in order; when the held step ran, in seconds after the
    start-up.)"""
    seen: list[str] = []
    ran: list[float] = []
    held: list = []
    started = 0.0

    async def schedule_loop_services():
        ran.append(time.monotonic() - started)
        if step is not None:
            await step()

    async def app(scope, receive, send):
        nonlocal started
        await receive()  # lifespan.startup
        held.append(schedule_loop_services)  # what hold_loop_services keeps of Prefect's call
        started = time.monotonic()
        await send({"type": f"lifespan.startup.{outcome}"})
        if outcome == "failed":
            return
        seen.append((await receive())["type"])
        seen.append(f"shutdown began with the step {'done' if ran else 'not run'}")
        await send({"type": "lifespan.shutdown.complete"})

    async def go() -> None:
        messages = asyncio.Queue()
        await messages.put({"type": "lifespan.startup"})

        async def send(message):
            if message["type"] == "lifespan.startup.complete":
                asyncio.get_running_loop().call_later(shutdown_after, messages.put_nowait,
                                                      {"type": "lifespan.shutdown"})

        await LoopServicesAfterStart(app, held, delay=delay)({"type": "lifespan"}, messages.get, send)
        await asyncio.sleep(max(delay, linger))  # where a step left scheduled, or left running, would run

    asyncio.run(go())
    return seen, ran


def test_prefects_loop_services_are_scheduled_seconds_after_the_server_started_and_it_stops_as_usual():
    seen, ran = _serve("complete", delay=0.3, shutdown_after=0.8)
    assert len(ran) == 1 and ran[0] >= 0.3  # once, after the delay
    assert seen == ["lifespan.shutdown", "shutdown began with the step done"]  # and before the shutdown


def test_a_server_stopped_before_its_loop_services_were_scheduled_never_schedules_them():
    seen, ran = _serve("complete", delay=0.5, shutdown_after=0.1)
    assert ran == []
    assert seen == ["lifespan.shutdown", "shutdown began with the step not run"]


def test_a_shutdown_while_the_loop_services_are_being_scheduled_cancels_that_before_the_apps_shutdown():
    finished: list[bool] = []

    async def slow_step():
        await asyncio.sleep(1.0)
        finished.append(True)

    seen, ran = _serve("complete", delay=0.1, shutdown_after=0.3, step=slow_step, linger=1.2)
    assert len(ran) == 1 and finished == []  # begun, then cancelled
    assert seen == ["lifespan.shutdown", "shutdown began with the step done"]


def test_a_failed_start_schedules_no_loop_services():
    assert _serve("failed", delay=0.1, shutdown_after=0.1) == ([], [])


def test_loop_services_that_cannot_be_scheduled_are_logged_and_the_server_serves_on(caplog):
    async def failing_step():
        raise RuntimeError("docket is gone")

    with caplog.at_level(logging.ERROR, logger="trialflow.server.kept_server_app"):
        seen, ran = _serve("complete", delay=0.1, shutdown_after=0.4, step=failing_step)
    assert len(ran) == 1
    assert seen == ["lifespan.shutdown", "shutdown began with the step done"]
    assert "loop services could not be scheduled" in caplog.text and "docket is gone" in caplog.text
