"""Where a person opens an experiment's run: the Prefect UI page of a flow run on any Prefect API (the
kept server under its UI path, a team server, Prefect Cloud), and what the kept server's login page
asks for. Standard library only, except for Prefect Cloud or a ``PREFECT_UI_URL`` of its own."""

from __future__ import annotations

import os
from pathlib import Path

from .kept_server import AUTH_FILE, HOST, auth_for, recorded_address, server_home


def sign_in_note(api: str | None, home: Path | None = None) -> str:
    """What a person opening the UI of ``api`` needs to know when that is the kept server: its UI's
    login page, where a printed page leads first, takes the auth string, kept in a file only this user
    reads. Else nothing."""
    if not api or auth_for(api, home) is None:
        return ""
    return f" (its login page asks for the auth string in {server_home(home) / AUTH_FILE})"


_DEFAULT_UIS: dict[str, str] = {}  # server root -> where its default UI is, as that server said


def _default_ui(root: str) -> str:
    """Where the server whose UI is at ``root`` serves the UI it opens by default: Prefect's newer UI
    lives under ``v2`` (its ``ui-settings`` says where), and of the two only it takes a page deeper in
    through its login page when the API asks for an auth string. ``root`` itself when the server does not say.
    Asked once per process and server (the live table shows the page every second); a server that
    does not answer is asked again next time."""
    import json
    import urllib.parse
    import urllib.request

    if root in _DEFAULT_UIS:
        return _DEFAULT_UIS[root]
    try:
        with urllib.request.urlopen(f"{root}/ui-settings", timeout=2.0) as response:
            settings = json.load(response)
        base = settings.get("v2_base_url") if settings.get("default_ui") == "v2" else None
    except (OSError, ValueError, AttributeError):
        return root
    origin = urllib.parse.urlsplit(root)._replace(path="").geturl()  # the server names the path from /
    ui = f"{origin}/{base.strip('/')}" if isinstance(base, str) and base.strip("/") else root
    _DEFAULT_UIS[root] = ui
    return ui


def flow_run_page(api: str | None, flow_run_id: str | None) -> str | None:
    """The Prefect UI page of a flow run on the API ``api`` (None for Prefect's temporary server, which
    serves no UI). A server's API at ``…/api`` has its UI at ``…`` (Prefect's own rule; Prefect is only
    imported for Prefect Cloud or a PREFECT_UI_URL of its own), or under its ``--url_prefix`` for the
    kept server of this home."""
    if not api or not flow_run_id:
        return None
    if api.endswith("/api") and "/api/" not in api and not os.environ.get("PREFECT_UI_URL"):
        port, prefix = recorded_address()
        root = api[:-4] + (prefix if api == f"http://{HOST}:{port}/api" else "")
        return f"{_default_ui(root)}/runs/flow-run/{flow_run_id}"
    from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api}):
        ui = PREFECT_UI_URL.value()
    return f"{ui.rstrip('/')}/runs/flow-run/{flow_run_id}" if ui else None
