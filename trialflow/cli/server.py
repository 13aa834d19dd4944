"""The ``server`` group: trialflow's kept local Prefect server (start, env, status, stop)."""

from __future__ import annotations

import os
import shlex
from typing import TYPE_CHECKING, Annotated

import typer

from ..foundation.status import EXPERIMENT_LIVE
from .common import SERVER_ENV_LINE, CliError, UrlPrefixOpt, _experiments, console

if TYPE_CHECKING:
    from ..server.kept_server import KeptServer


server_app = typer.Typer(help="trialflow's kept local Prefect server and its UI (used when PREFECT_API_URL is "
                         "not set).", no_args_is_help=True)


def _configured_api_note() -> None:
    if os.environ.get("PREFECT_API_URL"):
        console.print(f"note: PREFECT_API_URL is set ({os.environ['PREFECT_API_URL']}): experiments report there, "
                      "not to this server", soft_wrap=True, highlight=False)


def _print_server(server: KeptServer, what: str) -> None:
    console.print(f"Prefect server {what}: UI [bold]{server.ui_url}[/]  API {server.url}  (pid {server.pid})",
                  markup=True, soft_wrap=True, highlight=False)
    console.print(f"  database and log: {server.home}", soft_wrap=True, highlight=False)
    console.print(f"  private to you: the UI and API ask for the auth string in {server.home / 'auth'}",
                  soft_wrap=True, highlight=False)
    console.print(f"  prefect commands and Python in your shell: {SERVER_ENV_LINE}", soft_wrap=True, highlight=False)


@server_app.command("start")
def server_start(port: Annotated[int | None, typer.Option(
        "--port", min=1, max=65535, help="the port it listens on, kept for its later starts")] = None,
                 url_prefix: UrlPrefixOpt = None) -> None:
    """Start the kept server (once; experiments start it on first use anyway)."""
    from ..server.api_choice import server_choice
    from ..server.kept_server import ensure_server, running_server

    already = running_server()
    server = ensure_server(**server_choice(port, url_prefix))
    _print_server(server, "already running" if already else "started")
    _configured_api_note()


@server_app.command("env")
def server_env() -> None:
    """The shell line that points this shell's `prefect` commands and Python at the kept server (started
    when none runs), which then connect to its port only while your own user listens there:
    eval "$(trialflow server env)"."""
    from prefect.settings import PREFECT_API_URL

    from ..server.kept_server import HOST, ensure_server, running_server
    from ..server.port_guard import GUARD_ENV

    configured = PREFECT_API_URL.value()
    current = running_server()
    if configured and (current is None or configured != current.url):
        raise CliError(f"PREFECT_API_URL is set to {configured}: this shell reports there; unset it to use "
                       "trialflow's local Prefect server")
    server = ensure_server()
    server.wait_until_healthy()
    # the shell's Python processes (its prefect commands and workers) guard the port as trialflow's own do
    settings = {**server.client_settings(), GUARD_ENV: f"{HOST}:{server.port}"}
    typer.echo("export " + " ".join(f"{name}={shlex.quote(value)}" for name, value in settings.items()))


@server_app.command("status")
def server_status() -> None:
    """Whether the kept server runs and answers (exit code 1 when it does not run)."""
    from ..server.kept_server import running_server

    server = running_server()
    if server is None:
        console.print("Prefect server: not running (experiments start it; or: trialflow server start)")
        _configured_api_note()
        raise typer.Exit(1)
    healthy = server.healthy()
    _print_server(server, "running" if healthy else "starting or not answering")
    from ..app.spare_controller import SPARE_SETTING
    from ..server.spare_record import recorded_spare

    if (spare := recorded_spare(server.home)) is not None:
        console.print(f"spare controller: pid {spare.pid}, {'ready for' if spare.ready else 'loading for'} the next "
                      f"background create or resume ({SPARE_SETTING}=0 turns spares off)", highlight=False)
    _configured_api_note()
    if healthy and not server.ready():
        raise CliError(server.unreadable_database())


@server_app.command("stop")
def server_stop(force: Annotated[bool, typer.Option("--force", help="stop it even while experiments report to "
                                                    "it (they go on, without Prefect's records)")] = False) -> None:
    """Stop the kept server; the next experiment (or `server start`) starts it again, on the same port."""
    from ..server.kept_server import running_server, stop_server

    server = running_server()
    if server is None:
        console.print("Prefect server: not running")
        return
    users = [e.id for e in _experiments.list_experiments(None) if e.record.status in EXPERIMENT_LIVE
             and e.record.prefect_api == server.url]
    if users and not force:
        raise CliError(f"experiment(s) {', '.join(users)} report to this server: stop them first, or --force")
    stop_server()
    console.print(f"Prefect server stopped (was pid {server.pid} at {server.ui_url})", highlight=False)
