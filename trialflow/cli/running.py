"""Commands that run or stop experiments: ``create``, ``resume``, the hidden ``_run`` of a background
controller, ``stop`` and ``top``. An experiment runs in a background controller by default (as
``nnictl create``), or with ``--foreground`` in this terminal with a live progress display."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from ..app.controller_launch import PendingController, run_to_exit_code, wait_for_run_page
from ..app.spare_controller import start_next_spare, take_controller
from ..foundation.status import EXPERIMENT_LIVE, ExperimentStatus
from ..records.disk_space import NoSpaceLeft
from ..server.kept_server import ServerError
from .common import (
    DEFAULT_DASHBOARD_PORT,
    SERVER_ENV_LINE,
    CliError,
    DashboardOpt,
    DashboardPortOpt,
    DebugOpt,
    ExperimentDirOpt,
    RootOpt,
    StopSignals,
    UiPortOpt,
    UrlPrefixOpt,
    _config,
    _control,
    _experiments,
    _platforms,
    _run_control,
    _tuners,
    _warm,
    console,
    find_store,
    print_warnings,
    report_unreadable,
    root_of_experiment_dir,
    use_kept_server,
)
from .watching import dashboard_port_of, serve_until_interrupted, start_dashboard


def _stopped_by_signal(experiment_id: str, signum: int) -> None:
    console.print(f"experiment {experiment_id} {_run_control.stop_reason(signum)}: its running trials were cancelled; "
                  f"resume it: trialflow resume {experiment_id}", highlight=False)
    raise typer.Exit(128 + signum)


def launch(experiment_id: str, root: Path, config_path: str | None, foreground: bool, dashboard: bool = False,
            port: int = DEFAULT_DASHBOARD_PORT, controller: PendingController | None = None,
            earlier_run: str | None = None) -> None:
    """Run the experiment here (``foreground``) or in a background controller (``controller``: one
    started already, waiting for it). ``earlier_run``: the flow run a resumed experiment recorded
    last, whose page is not this run's."""
    live = start_dashboard(experiment_id, root, port) if dashboard else None
    if foreground:
        use_kept_server()
        from ..presentation.live import run_with_progress

        try:
            status, failure = run_with_progress(experiment_id, root, config_path, console)
        except BaseException as exc:
            if live is not None:
                live.stop()
            # stored as ERROR with it too
            if isinstance(exc, NoSpaceLeft):  # one line as it is: it says what to do
                raise
            if isinstance(exc, _platforms.PlatformError | _config.ConfigError | _tuners.TunerError | ServerError):
                raise CliError(f"experiment {experiment_id} could not run: {exc}") from None
            signum = _run_control.signal_of(exc)  # Prefect turns a SIGTERM inside the run into an exception of its own
            if signum is None:
                from ..flows.api_outage import api_failure_line, exit_now_if_api_gone

                line = api_failure_line(exc)  # one line, not a traceback, for a failed call to the API
                exit_now_if_api_gone(1, f"error: experiment {experiment_id}: {line or f'{type(exc).__name__}: {exc}'}",
                                     ended_by=exc)
                if line is not None:  # Prefect's temporary server: this process's own, no outage to wait out
                    raise CliError(f"experiment {experiment_id}: {line}") from None
                raise
            _stopped_by_signal(experiment_id, signum)
        if (signum := _run_control.interrupted()) is not None:
            if live is not None:
                live.stop()
            _stopped_by_signal(experiment_id, signum)
        if live is not None:
            console.print(f"experiment {experiment_id} ended {status}")
            serve_until_interrupted(live)
        if status != ExperimentStatus.DONE or failure:
            raise CliError(failure or f"experiment {experiment_id} ended {status}")
        return
    log_path = root / experiment_id / _experiments.CONTROLLER_LOG
    controller = controller or take_controller()
    controller.run(experiment_id, root, config_path)
    console.print(f"experiment [bold]{experiment_id}[/] started in the background (pid {controller.pid})", markup=True)
    page, on_kept_server = wait_for_run_page(controller, experiment_id, root, earlier_run)
    console.print(f"  Prefect UI: {page}", soft_wrap=True)
    if on_kept_server:  # a second shell's prefect commands need its address
        console.print(f"  prefect CLI: {SERVER_ENV_LINE}", soft_wrap=True, highlight=False)
    console.print(f"  progress:   trialflow trial ls {experiment_id}   log: {log_path}", soft_wrap=True)
    console.print(f"  stop:       trialflow stop {experiment_id}")
    start_next_spare()
    if live is not None:
        serve_until_interrupted(live)


def create(config: Annotated[Path, typer.Option("--config", "-c", help="experiment config (YAML/JSON)")],
           foreground: Annotated[bool, typer.Option("--foreground", "-f", help="run in this terminal")] = False,
           dashboard: DashboardOpt = False, dashboard_port: DashboardPortOpt = None, port: UiPortOpt = None,
           url_prefix: UrlPrefixOpt = None, debug: DebugOpt = False,
           warm_start: Annotated[list[str] | None, typer.Option(
               "--warm-start", help="an earlier experiment's id or an exported JSON file whose finished trials "
               "the tuner learns from (repeatable; added to the config's warmStart)")] = None) -> None:
    """Create an experiment from an NNI-style config file and start it."""
    live_port = dashboard_port_of(dashboard, dashboard_port)
    # the kept server (when it must start) and a background controller start at once: their start-up
    # overlaps the config's checks here
    server_port = use_kept_server(port, url_prefix)
    controller = None if foreground else take_controller()
    overrides = {"logLevel": "debug"} if debug else {}
    notes: list[str] = []
    try:
        cfg = _config.load_config(config, overrides or None)
        if warm_start:
            given = [_config.warm_source(v) for v in warm_start]  # a path is the shell's: from here
            cfg = cfg.model_copy(update={"warm_start": [*(cfg.warm_start or []), *given]})
        experiment_id, exp_dir = _warm.create_warm_started(  # checks the tuner first
            cfg, str(config.resolve()), overridden=[*overrides, *(["warmStart"] if warm_start else [])], notes=notes)
    except BaseException:
        if controller is not None:
            controller.cancel()
        raise
    console.print(f"experiment id: [bold]{experiment_id}[/]  directory: {escape(str(exp_dir))}", markup=True)
    for line in notes:
        console.print(line, highlight=False)
    if port is not None:
        store = _experiments.open_store(exp_dir.parent, experiment_id)
        try:
            _take_web_port(store, port, server_port)
        finally:
            store.close()
    launch(experiment_id, exp_dir.parent, str(config.resolve()), foreground, dashboard, live_port, controller)


def _take_web_port(store: _experiments.ExperimentStore, port: int, server_port: int | None) -> None:
    """nnictl's ``--port``: the experiment's address (``hold_web_port``); where the kept server runs on
    another port, this experiment is shown there, and the line says so."""
    _control.hold_web_port(store, port)
    if server_port is not None and server_port != port:
        console.print(f"the local Prefect server runs on port {server_port}: its UI shows this experiment there, "
                      f"and `trialflow stop --port {port}` finds it on port {port}", highlight=False)


def resume(experiment_id: str, root: RootOpt = None,
           foreground: Annotated[bool, typer.Option("--foreground", "-f")] = False,
           dashboard: DashboardOpt = False, dashboard_port: DashboardPortOpt = None, port: UiPortOpt = None,
           url_prefix: UrlPrefixOpt = None, debug: DebugOpt = False, experiment_dir: ExperimentDirOpt = None,
           trialnum: Annotated[int | None, typer.Option("--trialnum", help="continue to this many trials in all "
                                                        "(maxTrialNumber; more than it has run)")] = None,
           duration: Annotated[str | None, typer.Option("--duration", help="continue until this much run time "
                                                        "in all (maxExperimentDuration: '2h', seconds)")] = None
           ) -> None:
    """Resume a stopped or crashed experiment: re-attach running trials, keep counts. With --trialnum
    or --duration, continue a finished one with that larger budget (its tuner knows every trial)."""
    live_port = dashboard_port_of(dashboard, dashboard_port)
    base, store = find_store(experiment_id, root_of_experiment_dir(experiment_id, root, experiment_dir))
    for line in _control.prepare_resume(store, trialnum, duration):
        console.print(line, highlight=False)
    if port is not None or url_prefix is not None:
        server_port = use_kept_server(port, url_prefix)
        if port is not None:
            _take_web_port(store, port, server_port)
    if debug:
        _experiments.set_stored_fields(store, {"logLevel": "debug"})
    launch(experiment_id, base, None, foreground, dashboard, live_port, earlier_run=store.experiment().flow_run_id)


def run_detached(experiment_id: str, root: Annotated[Path, typer.Option("--root")],
                 config: Annotated[str | None, typer.Option("--config")] = None) -> None:
    use_kept_server()  # before Prefect is imported: every thread of the controller reports to it
    if run_to_exit_code(experiment_id, root, config):
        raise typer.Exit(1)


def stop(experiment_id: Annotated[str | None, typer.Argument()] = None,
         all_: Annotated[bool, typer.Option("--all", "-a", help="stop every running experiment")] = False,
         root: RootOpt = None,
         wait: Annotated[float, typer.Option(help="seconds to wait for the controller")] = 60.0,
         port: Annotated[int | None, typer.Option("--port", "-p", help="the running experiment on this port "
                                                  "(nnictl's web UI port): its Prefect server's, or the one "
                                                  "NNI's Python API started it on")] = None,
         ) -> None:
    """Stop an experiment (default: the only running one; `all` or --all: every running one; --port: the
    one on that port): running trials are cancelled (USER_CANCELED), status STOPPED."""
    all_ = all_ or experiment_id == "all"  # nnictl stop all
    if all_ and experiment_id not in (None, "all"):
        raise CliError("give an experiment id or --all, not both")
    if port is not None and (all_ or experiment_id is not None):
        raise CliError("give an experiment id, --all or --port, one of them")
    unreadable: list[str] = []
    if all_:
        targets = [(e.root, _experiments.open_store(e.root, e.id))
                   for e in _experiments.list_experiments(root, unreadable)
                   if e.record.status in EXPERIMENT_LIVE]
    elif port is not None:
        found = _experiments.the_one_on_port(port, root, unreadable)
        targets = [(found.root, _experiments.open_store(found.root, found.id))]
    else:
        targets = [find_store(experiment_id, root)]
    report_unreadable(unreadable)
    if not targets:
        console.print("no experiment is running: nothing to stop")
    for base, store in targets:
        before = store.experiment()
        held = _experiments.web_port(before)
        print_warnings(_control.stop_experiment(store, base, wait))
        after = store.experiment().status
        if before.status in EXPERIMENT_LIVE or after != before.status:
            console.print(f"experiment {store.experiment_id} stopped")
        else:  # its record keeps how its run ended
            done = f"port {held} is given up" if held is not None else "nothing to stop"
            console.print(f"experiment {store.experiment_id} had already ended {after}: {done}")


def top(interval: Annotated[int, typer.Option("--time", "-t", help="seconds between refreshes")] = 3,
        root: RootOpt = None) -> None:
    """Watch the running experiments and their trials, refreshed every --time seconds (Ctrl-C quits)."""
    from rich.live import Live

    from ..presentation import views

    if interval < 1:
        raise CliError(f"bad --time {interval}: give at least 1 second")
    stop = StopSignals()
    console.print(f"running experiments, every {interval} s; Ctrl-C quits", highlight=False)
    view = views.RunningView(root)
    try:
        with Live(views.running_table(root, view), console=console, auto_refresh=False) as live:
            while not stop.wait(interval):
                live.update(views.running_table(root, view), refresh=True)
    finally:
        view.close()
    console.print()
