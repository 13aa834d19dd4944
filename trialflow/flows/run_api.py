"""Which Prefect API an experiment run in this process reports to: a configured one, trialflow's kept
local server, or Prefect's temporary server (``TRIALFLOW_PREFECT_SERVER=temporary``)."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from ..foundation.startup_gc import collector_paused
from ..server.api_choice import wants_temporary_server
from ..server.kept_server import PLAIN_HTTP_TRUST, KeptServer, ServerError, ensure_server, revive, running_server
from .api_outage import unreachable
from .temporary_server import start_temporary_server

# What a flow run imports on its first steps (Prefect's engines, the FastAPI encoder its parameters go
# through, the artifact client, the async backend of its threads): imported before the wait for a
# server still starting instead of after it, they leave a cold start's critical path.
FIRST_RUN_IMPORTS = ("prefect.flow_engine", "prefect.task_engine", "prefect.utilities.visualization",
                     "fastapi.encoders", "prefect.artifacts", "anyio._backends._asyncio", "numpy.random")
# What the default tuner imports once the flow has begun (Optuna): imported only when the kept
# server is still starting, in time this process would otherwise spend waiting for it
WHILE_STARTING_IMPORTS = ("optuna", "trialflow.tuners.optuna_tuners")
STARTING_PROBE_SECONDS = 0.05  # a server that does not answer its health check this soon is still starting


@contextmanager
def experiment_api() -> Iterator[str | None]:
    """While an experiment runs in this process: the configured Prefect API as it is (yields None; when it
    is the address of this home's kept server, stopped since, that server is started again); with
    ``TRIALFLOW_PREFECT_SERVER=temporary`` Prefect's temporary server, started in a session of its own
    (yields None); else the kept server, started if needed, set as this context's PREFECT_API_URL
    (yields its URL). Raises :class:`ServerError` when the kept server cannot start or a configured API
    does not answer."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with collector_paused():
        for module in FIRST_RUN_IMPORTS:
            importlib.import_module(module)
    if PREFECT_API_URL.value():
        # the kept server this process (or the CLI that started it) was pointed at, gone since: started
        # again, as resume does, instead of the run failing against an address trialflow chose itself
        revive(PREFECT_API_URL.value())
        server = running_server()
        if server is not None and server.url == PREFECT_API_URL.value():  # maybe still starting
            _wait_until_healthy(server)
            with temporary_settings(updates=kept_server_client(server)):  # its auth string also when not set
                yield None
            return
        _check_answers(PREFECT_API_URL.value())
        yield None
        return
    if wants_temporary_server():
        start_temporary_server()
        yield None
        return
    server = ensure_server()
    with temporary_settings(updates=kept_server_client(server)):
        yield server.url


def kept_server_client(server: KeptServer) -> dict[Any, str | None]:
    """The Prefect settings of a client of the kept server ``server``: its address, its auth string and,
    as the CA file, :data:`PLAIN_HTTP_TRUST` (the address is plain HTTP: no certificate is checked there,
    so none is trusted that would be elsewhere; left out when the file is missing from the installation)."""
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_SSL_CERT_FILE, PREFECT_API_URL

    trust = {PREFECT_API_SSL_CERT_FILE: str(PLAIN_HTTP_TRUST)} if PLAIN_HTTP_TRUST.is_file() else {}
    return {PREFECT_API_URL: server.url, PREFECT_API_AUTH_STRING: server.auth, **trust}


def _wait_until_healthy(server: KeptServer) -> None:
    """Return once ``server`` answers (see :meth:`KeptServer.wait_until_healthy`, which raises what it
    raises), importing :data:`WHILE_STARTING_IMPORTS` first when it is still starting (one that does not
    import is left for the run to meet, if it needs it)."""
    if not server.healthy(timeout=STARTING_PROBE_SECONDS):
        with collector_paused():
            for module in WHILE_STARTING_IMPORTS:
                with suppress(ImportError):
                    importlib.import_module(module)
    server.wait_until_healthy()


def _check_answers(api: str) -> None:
    """Raise :class:`ServerError` when the configured API ``api`` cannot be reached at all, in one line
    instead of the traceback of the flow run's first request."""
    problem = unreachable()
    if problem is not None:
        raise ServerError(f"the Prefect API at {api} (PREFECT_API_URL) does not answer "
                          f"({str(problem) or type(problem).__name__}): start that server, or unset "
                          "PREFECT_API_URL to report to trialflow's local Prefect server")
