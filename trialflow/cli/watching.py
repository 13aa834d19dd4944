"""Commands that show an experiment without changing it: ``view``, the live ``dashboard``, ``webui
url`` (its Prefect UI page) and ``tensorboard``; and NNI's ``jupyter-extension``, which says where the UI is."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from .common import (
    DEFAULT_DASHBOARD_PORT,
    CliError,
    DashboardOpt,
    DashboardPortOpt,
    ExperimentDirOpt,
    ExpIdArg,
    RootOpt,
    StopSignals,
    UrlPrefixOpt,
    _control,
    _experiments,
    _views,
    console,
    find_store,
    root_of_experiment_dir,
    use_kept_server,
)

if TYPE_CHECKING:
    from ..presentation.dashboard import LiveDashboard
    from ..records.store import ExperimentRecord


def dashboard_port_of(dashboard: bool, port: int | None) -> int:
    """The port of the dashboard ``--dashboard`` asks for; ``--dashboard-port`` alone is a mistake."""
    if port is not None and not dashboard:
        raise CliError("--dashboard-port is the dashboard's port: add --dashboard, or leave --dashboard-port out")
    return DEFAULT_DASHBOARD_PORT if port is None else port


def start_dashboard(experiment_id: str, root: Path, port: int, host: str = "127.0.0.1",
                     storage: str | None = None) -> LiveDashboard:
    from ..presentation.dashboard import LiveDashboard, journal_storage, open_mirror

    store = _experiments.open_store(root, experiment_id)
    try:
        mirror = open_mirror(store, storage or journal_storage(root / experiment_id))
        dashboard = LiveDashboard(store, mirror, host, port).start()
    except (ImportError, OSError) as exc:
        raise CliError(str(exc)) from None
    console.print(f"dashboard: [bold]{escape(dashboard.url)}[/]", markup=True, soft_wrap=True)
    return dashboard


def serve_until_interrupted(dashboard: LiveDashboard) -> None:
    """Keep serving until Ctrl-C or SIGTERM, then stop the dashboard cleanly."""
    stop = StopSignals()
    console.print("serving the dashboard; Ctrl-C stops it")
    try:
        while not stop.wait(3600):
            pass
    finally:
        dashboard.stop()


def view(experiment_id: str, root: RootOpt = None, dashboard: DashboardOpt = False,
         dashboard_port: DashboardPortOpt = None, experiment_dir: ExperimentDirOpt = None,
         url_prefix: UrlPrefixOpt = None) -> None:
    """Show an experiment's status, budget and best trial (read-only); with --url_prefix, its Prefect UI
    page on the local server serving its UI there."""
    live_port = dashboard_port_of(dashboard, dashboard_port)
    base, store = find_store(experiment_id, root_of_experiment_dir(experiment_id, root, experiment_dir))
    if url_prefix is not None:
        use_kept_server(url_prefix=url_prefix)
    _views.print_experiment(console, store)
    if url_prefix is not None:
        console.print(prefect_ui_line(store.experiment()), soft_wrap=True)
    if dashboard:
        serve_until_interrupted(start_dashboard(experiment_id, base, live_port))


def dashboard_command(experiment_id: str, port: Annotated[int | None, typer.Option(
                          "--port", "-p", min=0, max=65535, help="its port (default 8080; 0: any free one)")] = None,
                      host: Annotated[str, typer.Option("--host", help="address to bind; anyone who can reach "
                                                        "it can read and edit the study")] = "127.0.0.1",
                      storage: Annotated[str | None, typer.Option("--storage", help="Optuna storage URL for "
                                                                  "the study (default: a journal file in the "
                                                                  "experiment's directory)")] = None,
                      root: RootOpt = None) -> None:
    """Serve a live optuna-dashboard of a running or finished experiment (until Ctrl-C)."""
    base, _ = find_store(experiment_id, root)
    if host not in ("127.0.0.1", "localhost", "::1"):
        console.print(f"[yellow]warning:[/] the dashboard listens on {escape(host)}: it has no login, anyone who "
                      "can reach that address can read and edit the study", markup=True)
    serve_until_interrupted(start_dashboard(experiment_id, base, dashboard_port_of(True, port), host, storage))


def prefect_ui_line(record: ExperimentRecord) -> str:
    """The line naming the Prefect UI page of the experiment's latest flow run."""
    from ..server.prefect_ui_pages import flow_run_page, sign_in_note

    page = flow_run_page(record.prefect_api, record.flow_run_id)
    return f"Prefect UI: {page}{sign_in_note(record.prefect_api)}" if page else (
        "Prefect UI: none (the run used Prefect's temporary server, which has no UI; without "
        "TRIALFLOW_PREFECT_SERVER=temporary runs get trialflow's kept server and its UI)")


webui_app = typer.Typer(help="Where to watch an experiment: its Prefect UI page and live dashboard.",
                        no_args_is_help=True)


@webui_app.command("url")
def webui_url(experiment_id: ExpIdArg = None, root: RootOpt = None) -> None:
    """The experiment's Prefect UI page (its flow run) and its live dashboard's address, when serving.
    (NNI's web UI is Prefect's UI and optuna-dashboard here.)"""
    from ..records.store import Control

    _, store = find_store(experiment_id, root)
    record = store.experiment()
    console.print(prefect_ui_line(record), soft_wrap=True)
    dashboard = record.controls.get(Control.DASHBOARD_URL)
    console.print(f"dashboard: {dashboard}" if dashboard else
                  f"dashboard: none serving (trialflow dashboard {record.id})", soft_wrap=True)


jupyter_app = typer.Typer(help="NNI's JupyterLab extension, which trialflow has no need of: see webui url.",
                          no_args_is_help=True)
NO_JUPYTER_EXTENSION = ("trialflow has no JupyterLab extension to install or uninstall: its web UI is Prefect's, a "
                        "page of its own (trialflow webui url ID; any browser tab, JupyterLab's too), and the live "
                        "dashboard (trialflow dashboard ID)")


@jupyter_app.command("install")
def jupyter_install() -> None:
    """NNI's JupyterLab tab for its web UI: trialflow's UI is Prefect's own page (webui url)."""
    raise CliError(NO_JUPYTER_EXTENSION)


@jupyter_app.command("uninstall")
def jupyter_uninstall() -> None:
    """NNI's JupyterLab tab for its web UI: trialflow installs none."""
    raise CliError(NO_JUPYTER_EXTENSION)


tensorboard_app = typer.Typer(help="Serve trials' TensorBoard logs ($NNI_OUTPUT_DIR/tensorboard).",
                              no_args_is_help=True)


@tensorboard_app.command("start")
def tensorboard_start(experiment_id: str, root: RootOpt = None,
                      trials: Annotated[str | None, typer.Option("--trials", "--trial_id", help="trial ids, comma "
                                                                 "separated (default: every trial)")] = None,
                      port: Annotated[int, typer.Option("--port", min=0, max=65535, help="0: any free port")] = 6006,
                      host: Annotated[str, typer.Option("--host")] = "127.0.0.1") -> None:
    """Start a TensorBoard over the trials' logs; it serves until `tensorboard stop`. Remote
    trials' logs are copied here first (run start again to refresh them)."""
    from ..presentation import tensorboard

    base, store = find_store(experiment_id, root)
    wanted = [t.strip() for t in trials.split(",") if t.strip()] if trials else None
    service = _control.open_service(store, base)
    try:
        runs = tensorboard.trial_folders(store, service, wanted)
        server = tensorboard.start(base / experiment_id, runs, port, host)
    finally:
        service.close()
    if host not in ("127.0.0.1", "localhost", "::1"):
        console.print(f"[yellow]warning:[/] TensorBoard listens on {escape(host)}, with no login", markup=True,
                      highlight=False)
    console.print(f"TensorBoard of {len(runs)} trial(s) at {server.url} (pid {server.pid}); "
                  f"stop: trialflow tensorboard stop {experiment_id}", highlight=False)


@tensorboard_app.command("stop")
def tensorboard_stop(experiment_id: str, root: RootOpt = None) -> None:
    """Stop the experiment's TensorBoard."""
    from ..presentation import tensorboard

    base, _ = find_store(experiment_id, root)
    server = tensorboard.stop(base / experiment_id)
    console.print(f"stopped the TensorBoard at {server.url}", highlight=False)
