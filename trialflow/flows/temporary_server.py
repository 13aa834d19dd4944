"""A controller's temporary Prefect server: out of reach of the terminal's Ctrl-C, and gone with the
controller, however the controller ends.

Without ``PREFECT_API_URL`` Prefect starts a temporary API server as a child process and stops it at
exit. Started by Prefect it shares the terminal's process group, so a Ctrl-C meant for the experiment
also kills the server and leaves the controller retrying a dead API. :func:`start_temporary_server`
therefore starts it first, in a session of its own (Prefect then reuses it: one per process), and
answering this user's connections only (Prefect's temporary server has no auth string; see
:mod:`trialflow.server.own_user_only`).

A controller killed with SIGKILL never reaches Prefect's exit hook, and the server (~200 MB) would
stay. So each temporary server of this process gets a watchdog: a small process in a session of its
own that waits for the controller's death and then stops the server -- the same server, checked by
its start time, never a process that took its pid later. Lifecycle: a server started by
:func:`start_temporary_server` is watched from the moment its process exists; one Prefect started by
itself is watched by :func:`guard_temporary_servers`, called once the flow runs (idempotent). A
watchdog ends by itself once its server is gone.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ..server.kept_server import ServerError
from ..server.own_user_only import lookup_refusal
from ..server.prefect_db_template import database_of, remember, seed, seeded_settings
from ..trial.procs import stop_with, watch_next_child, with_this_trialflow

log = logging.getLogger("trialflow.experiment")
_GUARDED: set[int] = set()

_START_LOCK = threading.Lock()
MIN_STARTUP_SECONDS = 90


def start_temporary_server() -> str | None:
    """Start Prefect's temporary server in a session of its own when this process would use one (no
    ``PREFECT_API_URL``); returns its API URL, or None when a configured server is used. Idempotent.
    Raises ServerError where the kernel cannot name a connection's user (the server could not keep
    other users out), and what Prefect raises when the server cannot start."""
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return None
    if (refusal := lookup_refusal()) is not None:  # its server would refuse this process too
        raise ServerError(refusal)
    import prefect.server.api.server as server_module

    server = server_module.SubprocessASGIServer()
    with _START_LOCK:
        if not server.running:
            database, version, seeded = _new_database()
            # the file Prefect is about to create (migrated by this start), kept as the template afterwards
            created = database if database is not None and not seeded and not database.exists() else None
            # Prefect's own start (port choice, health wait, exit hook), with its Popen in a new session:
            # the server's command line stays Prefect's. Only this module's name is swapped, briefly.
            real = server_module.subprocess
            server_module.subprocess = SimpleNamespace(  # type: ignore[assignment]
                **{**vars(subprocess), "Popen": _popen_in_new_session})
            try:
                with _first_start_settings(seeded):
                    server.start(timeout=_startup_timeout())
            finally:
                server_module.subprocess = real
            if created is not None:
                remember(created, version)
    return server.api_url


def _startup_timeout() -> int:
    """Seconds to wait for the server's health endpoint: Prefect's setting, and at least
    :data:`MIN_STARTUP_SECONDS` -- a server migrating a new database on a loaded machine (a shared login
    node, a test run) can take longer than Prefect's default."""
    from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS

    return max(int(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value()), MIN_STARTUP_SECONDS)


def _new_database() -> tuple[Path | None, str | None, bool]:
    """The SQLite file the temporary server will use, the Prefect version, and whether that file was
    just seeded: a file that does not exist yet is seeded with a migrated empty copy when there is one
    (:mod:`trialflow.server.prefect_db_template`)."""
    from prefect import __version__
    from prefect.settings import get_current_settings

    url = get_current_settings().server.database.connection_url
    database = database_of(url.get_secret_value() if url is not None else None)
    seeded = database is not None and seed(database, __version__)
    return database, __version__, seeded


def _first_start_settings(seeded: bool) -> AbstractContextManager[object]:
    """Prefect settings for the server's start, which it passes to the server's process: on a database
    just seeded, no migration check and no registration of block types (:func:`seeded_settings`)."""
    if not seeded:
        return nullcontext()
    import prefect.settings

    return prefect.settings.temporary_settings(
        updates={getattr(prefect.settings, name): False for name in seeded_settings(os.environ)})


def _popen_in_new_session(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
    """The server's process (Prefect's command as :func:`own_user_command` makes it, with this trialflow on
    its PYTHONPATH), in a session of its own and watched from its first moment: its watchdog
    starts before it and stops the process that holds the pipe end handed to the server, so a
    controller SIGKILLed at any point of the start (seconds, more on a busy machine) leaves no server.
    (Nothing runs in the child before its exec: a ``preexec_fn`` could deadlock a threaded controller.)"""
    command = own_user_command(list(kwargs.pop("args") if "args" in kwargs else args[0]))
    env = with_this_trialflow(kwargs.pop("env", None) or dict(os.environ))
    held = watch_next_child(os.getpid())
    passed: tuple[int, ...] = tuple(kwargs.pop("pass_fds", ()))
    try:
        process: subprocess.Popen[bytes] = subprocess.Popen(  # type: ignore[call-overload]
            command, *args[1:], start_new_session=True, pass_fds=(*passed, held), env=env, **kwargs)
    finally:
        os.close(held)
    _GUARDED.add(process.pid)
    return process


def own_user_command(command: list[str]) -> list[str]:
    """Prefect's ``python -m uvicorn ARGS`` as ``python -m trialflow.server.own_user_only ARGS``: the
    same server, answering this user's connections only. Raises RuntimeError for any other command (a
    Prefect that starts its server otherwise), so the server never starts open to every user."""
    if list(command[1:3]) != ["-m", "uvicorn"]:
        raise RuntimeError(f"this Prefect starts its temporary server as {command[:3]}, which trialflow cannot keep "
                           "to your user: install the Prefect version trialflow requires, or use the kept server "
                           "(unset TRIALFLOW_PREFECT_SERVER)")
    return [command[0], "-m", "trialflow.server.own_user_only", *command[3:]]


def guard_temporary_servers() -> None:
    """Give each temporary Prefect server of this process that runs a watchdog (once): those Prefect
    started by itself, not through :func:`start_temporary_server`."""
    module = sys.modules.get("prefect.server.api.server")
    if module is None:  # never imported (a configured or kept server): no temporary server to guard
        return
    SubprocessASGIServer = module.SubprocessASGIServer
    for server in list(SubprocessASGIServer._instances.values()):
        process = getattr(server, "server_process", None)
        if process is not None:
            _guard(process)


def _guard(process: subprocess.Popen[bytes]) -> None:
    """A watchdog for ``process``, unless it has one or has ended."""
    if process.pid in _GUARDED or process.poll() is not None:
        return
    try:
        if not stop_with(os.getpid(), process.pid):
            return
    except OSError as exc:  # the experiment runs on; only a SIGKILL would leave the server behind
        log.warning("could not watch the temporary Prefect server (pid %s): %s", process.pid, exc)
        return
    _GUARDED.add(process.pid)
