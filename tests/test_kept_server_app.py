"""The kept server's app runs a request that met a busy SQLite again inside the server, so the client
never waits out its 2 s back-off for it. Checked on a Starlette app that fails as Prefect's server does
(an exception handler answers 503, then Starlette raises the error again for the server's log). And the
garbage collector, paused for the server's start, runs again once the start has settled."""

from __future__ import annotations

import asyncio
import gc
import sqlite3

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Mount, Route

from trialflow.server.kept_server_app import REPLAYS, CollectorResumedAfterStart, ReplayBusyWrites


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


def _start(outcome: str, settle: float) -> tuple[bool, bool]:
    """Run a lifespan start-up reporting ``outcome`` through CollectorResumedAfterStart with the collector
    paused; (collector running right after the report, running ``settle`` + 0.1 s later)."""

    async def app(scope, receive, send):
        await receive()  # lifespan.startup
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

    gc.disable()
    try:
        return asyncio.run(go())
    finally:
        gc.enable()


def test_the_collector_paused_for_a_server_start_runs_again_once_it_settled():
    assert _start("complete", settle=0.3) == (False, True)


def test_the_collector_runs_again_at_once_when_the_start_failed():
    assert _start("failed", settle=5.0) == (True, True)
