"""Which Prefect API a trialflow process reports to: a configured ``PREFECT_API_URL`` (the environment
or the active Prefect profile) as it is, Prefect's temporary server when
``TRIALFLOW_PREFECT_SERVER=temporary``, else the kept local server (:mod:`trialflow.server.kept_server`),
started on first use. Standard library only: the CLI decides before anything imports Prefect."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .kept_server import SERVER_SETTING, KeptServer, ensure_server


def set_process_defaults() -> None:
    """Settings every trialflow command runs with unless the environment sets them: no analytics from
    a Prefect server it starts, and no server logs in the user's terminal."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_LOGGING_LEVEL", "CRITICAL")


def wants_temporary_server() -> bool:
    """``TRIALFLOW_PREFECT_SERVER=temporary``: Prefect's temporary server, one per process."""
    return os.environ.get(SERVER_SETTING, "kept").strip().lower() == "temporary"


def _profiles_may_set_api() -> bool:
    """Whether the active Prefect profiles file may set PREFECT_API_URL (read as text: no Prefect import)."""
    home = Path(os.path.expanduser(os.environ.get("PREFECT_HOME", "~/.prefect")))
    path = Path(os.path.expanduser(os.environ.get("PREFECT_PROFILES_PATH", home / "profiles.toml")))
    try:
        return "PREFECT_API_URL" in path.read_text(errors="replace")
    except OSError:
        return False


def server_choice(port: int | None, url_prefix: str | None) -> dict[str, Any]:
    """:func:`ensure_server`'s arguments for what a user asked (nnictl's ``--port`` and ``--url_prefix``;
    None: not asked)."""
    return {**({} if port is None else {"port": port, "exact_port": True}), "url_prefix": url_prefix}


def point_this_process_at_kept_server(home: Path | None = None, port: int | None = None,
                                      url_prefix: str | None = None) -> KeptServer | None:
    """For a process about to run an experiment that has not imported Prefect yet (the CLI's controller):
    when no API is configured, start the kept server if needed (with ``port`` and ``url_prefix`` when
    given: :func:`server_choice`), without waiting for it, and set PREFECT_API_URL to it for this process
    and its children, so every thread reports to it. Returns the server, or None when an API is
    configured or the temporary server is asked for. Raises :class:`ServerError` when the server cannot
    start, or runs with another port or prefix than the ones given."""
    if not uses_kept_server():
        return None
    server = ensure_server(home, wait=False, **server_choice(port, url_prefix))
    os.environ.update(server.client_settings())
    no_telemetry_notice()
    return server


def uses_kept_server() -> bool:
    """Whether this process's experiments report to the kept server: no API configured (the environment
    or a Prefect profile) and the temporary server not asked for."""
    return not (os.environ.get("PREFECT_API_URL") or wants_temporary_server() or _profiles_may_set_api())


def no_telemetry_notice() -> None:
    """For a process about to import Prefect to report to the kept server: the kept server runs with
    analytics off, and Prefect's client sends nothing when its server says so; but Prefect's first import
    in a terminal still prints its telemetry notice, telling a new user to turn off what is off. Unless
    the user said otherwise, this process and its children say so (``DO_NOT_TRACK``)."""
    os.environ.setdefault("DO_NOT_TRACK", "1")
