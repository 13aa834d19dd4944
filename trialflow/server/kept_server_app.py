"""The kept server's ASGI app: Prefect's server app (what ``prefect server start`` serves) with requests
that failed only because SQLite was busy run again at once, inside the server, and started with the
garbage collector paused.

Why: Prefect's server answers a write that met SQLite's lock (``database is locked``: a deferred
transaction that must become a writer while another connection writes; SQLite fails it at once instead
of waiting) with a retryable 503, and Prefect's client retries it after 2 s, then 4 s, ... Right after a
start, the server's services write while the first experiment creates its flow run, and a cold start
would often wait out that first retry. Run again here after a few milliseconds, the write goes through;
after :data:`REPLAYS` tries the 503 goes to the client, whose own back-off then applies as before.

The collector (see :mod:`trialflow.foundation.startup_gc`) stays paused through Prefect's import, the app's
creation, its lifespan start-up and :data:`SETTLE_SECONDS` after it (its services' first steps, the
routes FastAPI builds on the first requests): the server answers its first request sooner so
(benchmarks/README.md has the figures). When it runs again, the start's garbage is freed once and the
objects alive then, which live as long as the server, are set aside from every later collection, so the
full collections of a server that stores an experiment's events walk only what it made since.

Prefect's loop services (the scheduler, the late-run and cancellation monitors, the work pools'
health check, ...: its "perpetual" services, each a step repeated every few seconds) are scheduled
:data:`LOOP_SERVICES_DELAY` seconds after the app's start-up instead of within it, so that their first
steps do not compete for the CPU with the first experiment's requests. Each loop only acts on what is
due, so starting a few seconds late only delays what they would do by as much. The services that
consume events (task-run states, the event store, automations) start with the app as before: an
event published before its consumer subscribes would be lost. The worker that runs those steps and
Prefect's other background tasks looks for due work every :data:`BACKGROUND_CHECK_SECONDS` instead of
four times a second (:func:`check_background_work_every`): a step runs up to that much past its time,
and an idle server spends a fifth less CPU.

Prefect's writes of event batches and task-run states reach SQLite as parameter sets of one statement
(:mod:`trialflow.server.sqlite_batch_writes`), not as a multi-row statement compiled for every batch.
A statement waits at most :data:`LOCK_WAIT_MS` for SQLite's write lock instead of Prefect's minute
(:func:`wait_for_locks_at_most`): a longer wait is the server waiting on itself.

Only this server's own user connects (:mod:`trialflow.server.own_user_only`): another user's
connection is closed before its request is read, so the auth string alone, which a controller sends
to whoever holds the port where the server is down and no keeper holds it, opens nothing to another
user.

Lifecycle: ``python -m trialflow.server.kept_server_app --fd N`` (:func:`main`, what the keeper
:mod:`trialflow.server.port_keeper` runs for :mod:`trialflow.server.kept_server`) serves the app under
uvicorn on the socket the keeper holds, through that module's protocol; uvicorn calls
:func:`create_app` once (it changes Prefect's server modules for the process: :func:`hold_loop_services`,
:func:`serve_made_app`, :func:`check_background_work_every`, :func:`wait_for_locks_at_most`,
:func:`~trialflow.server.sqlite_batch_writes.write_batches_as_parameter_sets`);
the wrappers hold no state between requests. Standard library only at import (uvicorn and Prefect's
app factory are imported when called).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from ..foundation.startup_gc import set_aside
from .own_user_only import check_lookup, own_user_only
from .prefect_replacement import replace_in_prefect
from .sqlite_batch_writes import write_batches_as_parameter_sets

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

PAUSES = (0.01, 0.05, 0.1)  # seconds before the 2nd, 3rd and 4th try (a lock is held for milliseconds)
REPLAYS = len(PAUSES) + 1  # tries inside the server before the 503 goes to the client
RETRYABLE = 503  # Prefect's answer to a SQLite busy error (and other errors a client may retry)
SETTLE_SECONDS = 2.0  # after the app's start-up, before the collector runs again
LOOP_SERVICES_DELAY = 5.0  # after the app's start-up, before Prefect's loop services are scheduled
BACKGROUND_CHECK_SECONDS = 1.0  # between the background-task worker's looks for due work (docket: 0.25)
LOCK_WAIT_MS = 5000  # the longest a statement waits for SQLite's write lock (Prefect: 60,000)

HeldCall = Callable[[], Awaitable[None]]


class ReplayBusyWrites:
    """ASGI middleware: an HTTP request the app answers with 503 is run again (its body replayed) up to
    :data:`REPLAYS` times; any other answer, and the last try's, goes to the client unchanged. A
    response is held only until its status is known. WebSockets and lifespan pass through."""

    def __init__(self, app: App) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = await _read_body(receive)
        # a fresh copy of the scope each try: routing writes into it (a mount's root_path and path)
        for pause in PAUSES:
            if await _run_once(self.app, dict(scope), body, receive, send, pass_503=False):
                return
            await asyncio.sleep(pause)
        await _run_once(self.app, dict(scope), body, receive, send, pass_503=True)


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client left: the app will see it too
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def _run_once(app: App, scope: Scope, body: bytes, receive: Receive, send: Send, pass_503: bool) -> bool:
    """Run the request once; False when it was answered 503 and that answer was dropped (not sent)."""
    delivered = False
    dropped = False

    async def replay() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # e.g. waiting for the client to disconnect

    async def forward(message: Message) -> None:
        nonlocal dropped
        if message["type"] == "http.response.start" and message["status"] == RETRYABLE and not pass_503:
            dropped = True
        if not dropped:
            await send(message)

    try:
        await app(scope, replay, forward)
    except Exception:
        if not dropped:
            raise
        # Starlette raises what it answered 503 for again after the answer (for the server's log); a
        # dropped answer is tried again instead
    return not dropped


class LoopbackHostOnly:
    """ASGI middleware: an HTTP or WebSocket request whose ``Host`` is not this server's loopback
    address (``127.0.0.1``, ``localhost`` or ``[::1]``, with its port) is answered 421 and never reaches
    the app. A web page that renamed its own host to 127.0.0.1 (DNS rebinding) sends its own name."""

    def __init__(self, app: App, port: int) -> None:
        self.app = app
        self.allowed = {f"{name}:{port}".encode() for name in ("127.0.0.1", "localhost", "[::1]")}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            host = dict(scope.get("headers") or []).get(b"host", b"").lower()
            if host not in self.allowed:
                if scope["type"] == "websocket":
                    await send({"type": "websocket.close", "code": 1008})
                    return
                await send({"type": "http.response.start", "status": 421,
                            "headers": [(b"content-type", b"text/plain")]})
                await send({"type": "http.response.body", "body": b"this server answers to 127.0.0.1 only\n"})
                return
        await self.app(scope, receive, send)


def _resume_collector_past_the_start() -> None:
    """Free the start's garbage, set aside every object alive now (Prefect's modules, the app, its
    routes) from all later collections, and run the collector again: a full collection then walks what
    the server made since, not the ~400,000 objects of its start again each time."""
    set_aside(collect_first=True)
    gc.enable()


class CollectorResumedAfterStart:
    """ASGI middleware around an app imported and created with the collector paused (``gc.disable()``):
    ``settle`` seconds after the app reports its lifespan start-up complete, the objects alive then are
    set aside from later collections and the collector runs again (:func:`_resume_collector_past_the_start`);
    at once, with nothing set aside, when it reports a failed one. Requests pass through untouched."""

    def __init__(self, app: App, settle: float = SETTLE_SECONDS) -> None:
        self.app = app
        self.settle = settle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def started(message: Message) -> None:
            if message["type"] == "lifespan.startup.complete":
                asyncio.get_running_loop().call_later(self.settle, _resume_collector_past_the_start)
            elif message["type"] == "lifespan.startup.failed":
                gc.enable()
            await send(message)

        await self.app(scope, receive, started)


def hold_loop_services() -> list[HeldCall] | None:
    """Make Prefect's server app, in this process, hold the step of its lifespan start-up that schedules
    its loop services: the step's calls are kept, in order, in the returned list, each to be awaited
    later (:class:`LoopServicesAfterStart`). None, and nothing changed, where this Prefect has no such
    step: its services then start with the app, as Prefect starts them."""
    held: list[HeldCall] = []

    def make(schedule: Any, _: Any) -> Callable[..., Awaitable[None]]:
        async def hold(*args: Any, **kwargs: Any) -> None:
            held.append(lambda: schedule(*args, **kwargs))

        return hold

    if not replace_in_prefect("prefect.server.api.background_workers", "register_and_schedule_perpetual_services",
                              make):
        return None
    return held


class LoopServicesAfterStart:
    """ASGI middleware around an app whose loop services :func:`hold_loop_services` held: the held calls
    run ``delay`` seconds after the app reports its lifespan start-up complete, none when it reports a
    failed one. A shutdown asked for before they ran, or while they run, cancels them before the app's
    own shutdown begins. A held call that raises is logged (the server's log) and the app serves on,
    without the loop services. Requests pass through untouched."""

    def __init__(self, app: App, held: list[HeldCall], delay: float = LOOP_SERVICES_DELAY) -> None:
        self.app = app
        self.held = held
        self.delay = delay

    async def _run_held(self) -> None:
        await asyncio.sleep(self.delay)
        while self.held:
            await self.held.pop(0)()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return
        later: asyncio.Task[None] | None = None

        async def started(message: Message) -> None:
            nonlocal later
            if message["type"] == "lifespan.startup.complete":
                later = asyncio.create_task(self._run_held())
                later.add_done_callback(_log_failure)
            await send(message)

        async def asked() -> Message:
            message = await receive()
            if message["type"] == "lifespan.shutdown" and later is not None and not later.done():
                later.cancel()
                await asyncio.wait([later])  # (awaiting the task itself would raise its cancellation here)
            return message

        await self.app(scope, asked, started)


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logging.getLogger(__name__).error("Prefect's loop services could not be scheduled; the server serves "
                                          "without them", exc_info=task.exception())


def _final_app(prefect_server: Any) -> bool:
    """Whether to ask Prefect for its "final" app: where FastAPI copies the routes of each router it
    includes (before 0.137), Prefect then drops the originals (~50 MB); it always ends that app's
    creation with a full collection, which elsewhere frees nothing and walks the start's ~300,000
    objects on the way to the first answer (a quarter of a second on two cores). The start's garbage
    is freed anyway when the collector resumes (:class:`CollectorResumedAfterStart`)."""
    return bool(getattr(prefect_server, "_FASTAPI_COPIES_ROUTES_ON_INCLUDE", True))


def serve_made_app(app: App) -> bool:
    """Make Prefect's ``create_app()`` called with no arguments in this process return ``app`` (the app
    Prefect made for this server) at once; True when replaced. Prefect's in-process API clients call it
    so (its services' clients, made as the services start, right after the server's start-up): each
    call hashed every setting and set logging up again (~0.12 s of CPU) before returning that same app
    from Prefect's cache, since the process's settings do not change. Other calls go to Prefect's."""
    def make(original: Any, _: Any) -> Callable[..., Any]:
        def create_app(settings: Any = None, ephemeral: bool = False, webserver_only: bool = False,
                       final: bool = False, ignore_cache: bool = False) -> Any:
            if settings is None and not (ephemeral or webserver_only or ignore_cache):
                return app
            return original(settings, ephemeral, webserver_only, final, ignore_cache)

        return create_app

    return replace_in_prefect("prefect.server.api.server", "create_app", make)


def check_background_work_every(seconds: float = BACKGROUND_CHECK_SECONDS) -> bool:
    """Make the worker that runs Prefect's background tasks in this process (docket's, under Prefect's
    ``background_worker``) look for due work every ``seconds`` instead of docket's four times a second;
    True when replaced. A task added to run now still starts at once while the worker has a free slot
    (its read of new work returns as soon as one comes); with all its slots taken it looks for a freed
    one every ``seconds``; a task due later, such as the next step of a loop service, starts up to
    ``seconds`` past its time. Idle, each look is a few in-memory Redis calls and their thread
    hand-offs: at docket's pace an idle server spent a quarter more CPU than at one look a second
    (benchmarks/README.md)."""
    from datetime import timedelta

    def make(worker: Any, _: Any) -> Callable[..., Any]:
        def checking_less_often(*args: Any, **kwargs: Any) -> Any:
            kwargs.setdefault("minimum_check_interval", timedelta(seconds=seconds))
            kwargs.setdefault("scheduling_resolution", timedelta(seconds=seconds))
            return worker(*args, **kwargs)

        return checking_less_often

    return replace_in_prefect("prefect.server.api.background_workers", "Worker", make)


def wait_for_locks_at_most(ms: int = LOCK_WAIT_MS) -> bool:
    """Make every SQLite connection of Prefect's server database in this process wait at most ``ms``
    milliseconds for the write lock (SQLite's ``busy_timeout``; Prefect sets 60 s), then fail with
    ``database is locked``; True when replaced. Only this process writes the kept server's database,
    where a write holds the lock for milliseconds: a statement still waiting after seconds waits on the
    server itself (its connections waiting on a transaction that waits for one of them), which SQLite
    ends only at the timeout while the server's other calls wait too. Ended after ``ms``, the failed
    write is run again: an API request by :class:`ReplayBusyWrites`, then by Prefect's client; a
    service's batch at its next flush."""

    # the class itself changes, not the module's name for it: Prefect's database dependencies imported
    # the class by name, and they make the configuration its engines come from
    def make(config_class: Any, _: Any) -> Any:
        original = config_class.setup_sqlite

        def setup_sqlite(self: Any, conn: Any, record: Any) -> None:
            original(self, conn, record)
            cursor = conn.cursor()
            cursor.execute(f"PRAGMA busy_timeout = {int(ms)};")
            cursor.close()

        config_class.setup_sqlite = setup_sqlite
        return config_class

    return replace_in_prefect("prefect.server.database.configurations", "AioSqliteConfiguration", make)


def create_app(port: int | None = None) -> App:
    """Prefect's server app (API, services and UI), writing event batches and task-run states as
    parameter sets (:mod:`~trialflow.server.sqlite_batch_writes`), waiting at most :data:`LOCK_WAIT_MS`
    for SQLite's write lock (:func:`wait_for_locks_at_most`), with its loop services held until
    :data:`LOOP_SERVICES_DELAY` after its start-up (:class:`LoopServicesAfterStart`) and its background
    work looked for every :data:`BACKGROUND_CHECK_SECONDS` (:func:`check_background_work_every`), wrapped in
    :class:`ReplayBusyWrites` and :class:`CollectorResumedAfterStart`, and with ``port`` in
    :class:`LoopbackHostOnly`; imported, created and started with the collector paused."""
    gc.disable()
    try:
        from prefect.server.api import server as prefect_server

        os.environ.pop("PREFECT__SERVER_FINAL", None)  # Prefect's switch for "final": _final_app decides
        app: App = prefect_server.create_app(final=_final_app(prefect_server))
        serve_made_app(app)
        check_background_work_every()
        write_batches_as_parameter_sets()
        wait_for_locks_at_most()
        held = hold_loop_services()
        if held is not None:
            app = LoopServicesAfterStart(app, held)
        app = ReplayBusyWrites(CollectorResumedAfterStart(app))
        return LoopbackHostOnly(app, port) if port is not None else app
    except BaseException:
        gc.enable()
        raise


def main(argv: list[str] | None = None) -> None:
    """Serve :func:`create_app` under uvicorn until a signal stops it: ``--fd``, a TCP socket the parent
    bound and made listen (it chose the port, and no one else can take it before the server serves),
    ``--log-level`` uvicorn's, ``--ready-fd`` a pipe to write :data:`~trialflow.server.port_keeper.READY`
    to once the app has started and serves (its keeper's sign that a later death is a crash). The
    events websocket goes uncompressed: its clients are on loopback, where deflate costs CPU on both
    ends for every event. Exits at once, naming the cause, where the kernel cannot tell which user
    makes a connection (:func:`check_lookup`)."""
    import argparse
    import socket

    import uvicorn

    from .port_keeper import READY

    parser = argparse.ArgumentParser(prog="python -m trialflow.server.kept_server_app")
    parser.add_argument("--fd", type=int, required=True, help="a listening TCP socket to serve on")
    parser.add_argument("--log-level", default="warning")
    parser.add_argument("--ready-fd", type=int, help="a pipe to write to once serving")
    args = parser.parse_args(argv)
    check_lookup()
    sock = socket.socket(fileno=args.fd)  # family and protocol read from the socket (TCP_NODELAY applies)
    port = int(sock.getsockname()[1])
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started and args.ready_fd is not None:
                os.write(args.ready_fd, READY)
                os.close(args.ready_fd)

    config = uvicorn.Config(lambda: create_app(port), factory=True, lifespan="on", log_level=args.log_level,
                            ws_per_message_deflate=False, http=own_user_only(AutoHTTPProtocol))
    try:
        Server(config).run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn shut down on SIGINT, then raised it again: stopped as asked
        pass


if __name__ == "__main__":
    main()
