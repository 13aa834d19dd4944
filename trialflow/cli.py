"""``trialflow``: nnictl-style commands (typer + rich).

Errors exit non-zero with one ``error:`` line naming what is wrong and how to fix it (config errors
list one line per bad field). Experiments run in a detached background process by default, like
``nnictl create``; ``--foreground`` runs in this terminal with a live progress display.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from ._lazy import lazy_module
from .controller_launch import CONTROLLER_OUTPUT, PendingController, run_to_exit_code
from .disk_space import NoSpaceLeft, no_space
from .ids import looks_like_experiment_id
from .kept_server import ServerError
from .spare_controller import start_next_spare, take_controller
from .status import EXPERIMENT_LIVE, ExperimentStatus
from .user_errors import UserError

if TYPE_CHECKING:
    from .kept_server import KeptServer
    from .presentation.dashboard import LiveDashboard
    from .store import ExperimentRecord, ExperimentStore
    from .store_reader import RecordSource

# imported on first use: `trialflow --help` and light commands never import Prefect, Optuna or SDKs
_config = lazy_module("trialflow.config")
_control = lazy_module("trialflow.control")
_records = lazy_module("trialflow.store_records")
_experiments = lazy_module("trialflow.experiments")
_warm = lazy_module("trialflow.warm_start")
_run_control = lazy_module("trialflow.flows.run_control")
_platforms = lazy_module("trialflow.platforms")
_results = lazy_module("trialflow.results")
_tuners = lazy_module("trialflow.tuners")
_views = lazy_module("trialflow.presentation.views")

app = typer.Typer(help="Hyperparameter-tuning experiments on Prefect (NNI-compatible).", no_args_is_help=True,
                  add_completion=False, pretty_exceptions_enable=False)
experiment_app = typer.Typer(help="List, show, export, import and delete experiments.", no_args_is_help=True)
trial_app = typer.Typer(help="List and kill trials.", no_args_is_help=True)
log_app = typer.Typer(help="Show trial logs.", no_args_is_help=True)
update_app = typer.Typer(help="Change a running experiment: concurrency, trialnum, duration.", no_args_is_help=True)
config_app = typer.Typer(help="Work with experiment config files.", no_args_is_help=True)
algo_app = typer.Typer(help="Register customized tuners and assessors under a name (NNI's nnictl algo).",
                       no_args_is_help=True)
app.add_typer(experiment_app, name="experiment")
app.add_typer(trial_app, name="trial")
app.add_typer(log_app, name="log")
app.add_typer(update_app, name="update")
app.add_typer(config_app, name="config")
app.add_typer(algo_app, name="algo")
tensorboard_app = typer.Typer(help="Serve trials' TensorBoard logs ($NNI_OUTPUT_DIR/tensorboard).",
                              no_args_is_help=True)
app.add_typer(tensorboard_app, name="tensorboard")
console = Console(markup=False)  # printed values are never read as markup; styled lines say markup=True
_default_show_warning = warnings.showwarning
_WARNED: set[str] = set()

RootOpt = Annotated[Path | None, typer.Option("--root", help="experiment working directory to search")]
ExpIdArg = Annotated[str | None, typer.Argument(metavar="[ID]", help="experiment id (default: the only running one)",
                                                show_default=False)]
TrialIdOpt = Annotated[str | None, typer.Option("--trial_id", "-T", help="the trial's id (or give it after the "
                                                "experiment id)")]
DashboardOpt = Annotated[bool, typer.Option("--dashboard", help="also serve a live optuna-dashboard of it "
                                            "(until Ctrl-C)")]
DashboardPortOpt = Annotated[int | None, typer.Option("--dashboard-port", help="the dashboard's port (default "
                                                      "8080; 0: any free one; with --dashboard)")]
UiPortOpt = Annotated[int | None, typer.Option("--port", "-p", min=1, max=65535, help="the port of the local Prefect "
                                               "server, whose UI is NNI's web UI here (kept for its later starts)")]
UrlPrefixOpt = Annotated[str | None, typer.Option("--url_prefix", "--url-prefix", "-u", help="the path the local "
                                                 "Prefect server serves its UI under (e.g. nni; kept for its "
                                                 "later starts; / for the root)")]
DebugOpt = Annotated[bool, typer.Option("--debug", "-d", help="log at debug level (the config's logLevel: debug)")]
ExperimentDirOpt = Annotated[Path | None, typer.Option("--experiment_dir", "-e", help="the experiment's folder "
                                                       "(its parent is the working directory to search)")]
DEFAULT_DASHBOARD_PORT = 8080
MAX_IMPORT_BYTES = 64 * 1024 * 1024  # an import file is read whole


class CliError(UserError):
    """A user-facing failure: printed as one line, exit code 1."""


def _fail(message: str) -> None:
    raise CliError(message)


def _store(experiment_id: str | None, root: Path | None) -> tuple[Path, ExperimentStore]:
    """The experiment's working directory and store; without an id, the only running experiment (as
    nnictl)."""
    return _experiments.find_experiment(_given_or_running(experiment_id, root), root)


def _records_only(experiment_id: str | None, root: Path | None) -> tuple[Path, RecordSource]:
    """:func:`_store` for the commands that only read records (no SQLAlchemy for an embedded store)."""
    return _experiments.find_records(_given_or_running(experiment_id, root), root)


def _given_or_running(experiment_id: str | None, root: Path | None) -> str:
    if experiment_id is not None:
        return experiment_id
    running = [e.id for e in _experiments.list_experiments(root) if e.record.status in EXPERIMENT_LIVE]
    if len(running) != 1:
        raise CliError("no experiment is running: give an experiment id (trialflow experiment list --all)"
                       if not running else f"{len(running)} experiments are running ({', '.join(running)}): "
                       "give the id of one")
    return running[0]


def _warn(warnings: list[str]) -> None:
    for warning in warnings:
        console.print(f"[yellow]warning:[/] {escape(warning)}", markup=True, highlight=False)


# ---- running experiments -----------------------------------------------------------------------


def _dashboard_port(dashboard: bool, port: int | None) -> int:
    """The port of the dashboard ``--dashboard`` asks for; ``--dashboard-port`` alone is a mistake."""
    if port is not None and not dashboard:
        raise CliError("--dashboard-port is the dashboard's port: add --dashboard, or leave --dashboard-port out")
    return DEFAULT_DASHBOARD_PORT if port is None else port


def _in_experiment_dir(experiment_id: str, root: Path | None, experiment_dir: Path | None) -> Path | None:
    """The root to search given nnictl's ``-e/--experiment_dir`` (the experiment's own folder)."""
    if experiment_dir is None:
        return root
    if root is not None:
        raise CliError("give --root or --experiment_dir, not both")
    folder = experiment_dir.expanduser().resolve()
    if folder.name != experiment_id:
        raise CliError(f"--experiment_dir {experiment_dir} is not the folder of experiment {experiment_id} (its "
                       f"folder is named {experiment_id}): give that folder, or its parent with --root")
    return folder.parent


def _start_dashboard(experiment_id: str, root: Path, port: int, host: str = "127.0.0.1",
                     storage: str | None = None) -> LiveDashboard:
    from .presentation.dashboard import LiveDashboard, journal_storage, open_mirror

    store = _experiments.open_store(root, experiment_id)
    try:
        mirror = open_mirror(store, storage or journal_storage(root / experiment_id))
        dashboard = LiveDashboard(store, mirror, host, port).start()
    except (ImportError, OSError) as exc:
        raise CliError(str(exc)) from None
    console.print(f"dashboard: [bold]{escape(dashboard.url)}[/]", markup=True, soft_wrap=True)
    return dashboard


def _interrupt_on_signals() -> None:
    """Ctrl-C and SIGTERM raise KeyboardInterrupt here, also when this process was started with SIGINT
    ignored (a background job of a shell without job control passes that on)."""
    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, interrupt)


def _serve_until_interrupted(dashboard: LiveDashboard) -> None:
    """Keep serving until Ctrl-C or SIGTERM, then stop the dashboard cleanly."""
    _interrupt_on_signals()
    console.print("serving the dashboard; Ctrl-C stops it")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        dashboard.stop()


def _stopped_by_signal(experiment_id: str, signum: int) -> None:
    console.print(f"experiment {experiment_id} {_run_control.stop_reason(signum)}: its running trials were cancelled; "
                  f"resume it: trialflow resume {experiment_id}", highlight=False)
    raise typer.Exit(128 + signum)


def _launch(experiment_id: str, root: Path, config_path: str | None, foreground: bool, dashboard: bool = False,
            port: int = DEFAULT_DASHBOARD_PORT, controller: PendingController | None = None,
            earlier_run: str | None = None) -> None:
    """Run the experiment here (``foreground``) or in a background controller (``controller``: one
    started already, waiting for it). ``earlier_run``: the flow run a resumed experiment recorded
    last, whose page is not this run's."""
    live = _start_dashboard(experiment_id, root, port) if dashboard else None
    if foreground:
        _use_kept_server()
        from .presentation.live import run_with_progress

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
                from .flows.api_outage import exit_now_if_api_gone

                exit_now_if_api_gone(1, f"error: experiment {experiment_id}: {type(exc).__name__}: {exc}")
                raise
            _stopped_by_signal(experiment_id, signum)
        if (signum := _run_control.interrupted()) is not None:
            if live is not None:
                live.stop()
            _stopped_by_signal(experiment_id, signum)
        if live is not None:
            console.print(f"experiment {experiment_id} ended {status}")
            _serve_until_interrupted(live)
        if status != ExperimentStatus.DONE or failure:
            raise CliError(failure or f"experiment {experiment_id} ended {status}")
        return
    log_path = root / experiment_id / _experiments.CONTROLLER_LOG
    controller = controller or take_controller()
    controller.run(experiment_id, root, config_path)
    console.print(f"experiment [bold]{experiment_id}[/] started in the background (pid {controller.pid})", markup=True)
    page, on_kept_server = _run_page(experiment_id, root, controller, earlier_run)
    console.print(f"  Prefect UI: {page}", soft_wrap=True)
    if on_kept_server:  # a second shell's prefect commands need its address
        console.print(f"  prefect CLI: {SERVER_ENV_LINE}", soft_wrap=True, highlight=False)
    console.print(f"  progress:   trialflow trial ls {experiment_id}   log: {log_path}", soft_wrap=True)
    console.print(f"  stop:       trialflow stop {experiment_id}")
    start_next_spare()
    if live is not None:
        _serve_until_interrupted(live)


def _use_kept_server(port: int | None = None, url_prefix: str | None = None) -> None:
    """Without a configured Prefect API, this process and the controllers it starts use the kept local
    server (started now when none runs, without waiting: it comes up while the controller imports);
    ``port`` and ``url_prefix`` (nnictl's ``--port`` and ``--url_prefix``): the port it must listen on
    and the path it must serve its UI under."""
    from .kept_server import SERVER_SETTING, point_this_process_at_kept_server, wants_temporary_server

    chosen = [flag for flag, value in (("--port", port), ("--url_prefix", url_prefix)) if value is not None]
    if chosen and os.environ.get("PREFECT_API_URL"):
        raise CliError(f"{chosen[0]} is for the local Prefect server, but PREFECT_API_URL is set to "
                       f"{os.environ['PREFECT_API_URL']} (experiments report there): leave {chosen[0]} out, or "
                       "unset it")
    if point_this_process_at_kept_server(port=port, url_prefix=url_prefix) is None and chosen:
        why = (f"{SERVER_SETTING}={os.environ[SERVER_SETTING]} asks for Prefect's temporary server, which has no UI"
               if wants_temporary_server() else "your Prefect profiles set PREFECT_API_URL (`prefect config "
               "view` shows the active one)")
        raise CliError(f"{chosen[0]} is for trialflow's local Prefect server, but {why}: leave {chosen[0]} out")


SERVER_ENV_LINE = 'eval "$(trialflow server env)"'
RUN_PAGE_WAIT = 60.0  # how long `create` waits for its run's page (a slow platform's set-up comes after it)


def _run_page(experiment_id: str, root: Path, controller: PendingController,
              earlier_run: str | None) -> tuple[str, bool]:
    """The Prefect UI page of the background controller's flow run, once it has recorded it (as nnictl
    prints its web UI's address): a run other than ``earlier_run``, the one a resumed experiment had;
    and whether that is on the kept server. Raises :class:`CliError` when the controller ends before that."""
    from .kept_server import flow_run_page, sign_in_note

    store = _experiments.open_store(root, experiment_id)
    deadline = time.monotonic() + RUN_PAGE_WAIT
    try:
        while time.monotonic() < deadline:
            record = store.experiment()
            if record.flow_run_id and record.flow_run_id != earlier_run:
                page = flow_run_page(record.prefect_api, record.flow_run_id)
                note = sign_in_note(record.prefect_api)  # only the kept server has one
                return (page + note, bool(note)) if page else (
                    "none (Prefect's temporary server has no UI: unset TRIALFLOW_PREFECT_SERVER)", False)
            if controller.ended():
                log = root / experiment_id / Path(_experiments.CONTROLLER_LOG).parent / CONTROLLER_OUTPUT
                why = record.message or f"see {log if log.exists() else controller.spool}"
                raise CliError(f"experiment {experiment_id} ended at once ({record.status}): {why}")
            time.sleep(0.05)
    finally:
        store.close()
    return f"not known yet: trialflow webui url {experiment_id}", False


@app.command()
def create(config: Annotated[Path, typer.Option("--config", "-c", help="experiment config (YAML/JSON)")],
           foreground: Annotated[bool, typer.Option("--foreground", "-f", help="run in this terminal")] = False,
           dashboard: DashboardOpt = False, dashboard_port: DashboardPortOpt = None, port: UiPortOpt = None,
           url_prefix: UrlPrefixOpt = None, debug: DebugOpt = False,
           warm_start: Annotated[list[str] | None, typer.Option(
               "--warm-start", help="an earlier experiment's id or an exported JSON file whose finished trials "
               "the tuner learns from (repeatable; added to the config's warmStart)")] = None) -> None:
    """Create an experiment from an NNI-style config file and start it."""
    live_port = _dashboard_port(dashboard, dashboard_port)
    # the kept server (when it must start) and a background controller start at once: their start-up
    # overlaps the config's checks here
    _use_kept_server(port, url_prefix)
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
    _launch(experiment_id, exp_dir.parent, str(config.resolve()), foreground, dashboard, live_port, controller)


@config_app.command("convert")
def config_convert(config: Annotated[Path, typer.Argument(help="an NNI v1 config file (YAML/JSON)")],
                   output: Annotated[Path | None, typer.Option("--output", "-o", help="write it here instead of "
                                                               "printing it")] = None) -> None:
    """Print (or write) the NNI v2 equivalent of a v1 config file, checked by loading it. Relative
    paths stay as written: keep the result next to the original."""
    import yaml

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        converted = _config.convert_config_file(config)
    if converted is None:
        raise CliError(f"{config} is already a v2 config (no trainingServicePlatform, trial or *Config sections); "
                       "nothing to convert")
    text = yaml.safe_dump(converted, sort_keys=False, allow_unicode=True)
    if output is None:
        typer.echo(text, nl=False)
    else:
        output.write_text(text, encoding="utf-8")
        console.print(f"wrote the v2 config to {output}")


@algo_app.command("register")
def algo_register(meta: Annotated[Path, typer.Option("--meta", "--meta_path", "-m", help="NNI meta file: algoType, "
                                                     "builtinName, className[, classArgsValidator]")]) -> None:
    """Register a customized tuner or assessor; configs then name it like a built-in one. The meta
    file's folder is where its module is looked up."""
    from .assessors import ASSESSORS
    from .tuners import TUNERS
    from .tuners.custom import load_class
    from .tuners.registry import read_meta, register

    entry = read_meta(meta)
    load_class(entry.class_name, entry.code_directory, entry.builtin_name)
    if entry.class_args_validator:
        load_class(entry.class_args_validator, entry.code_directory, f"{entry.builtin_name} classArgsValidator")
    register(entry, set(TUNERS) | set(ASSESSORS))
    name = escape(entry.builtin_name)
    console.print(f"registered {entry.algo_type} [bold]{name}[/] ({escape(entry.class_name)}); use it as "
                  f"{entry.algo_type}: {{name: {name}}}", markup=True, highlight=False)


@algo_app.command("list")
def algo_list() -> None:
    """The built-in and the registered algorithms, as NNI's ``nnictl algo list``."""
    from rich.table import Table

    from .assessors import ASSESSORS
    from .assessors import NNI_NAMES as ASSESSOR_NAMES
    from .tuners import NNI_NAMES as TUNER_NAMES
    from .tuners import TUNERS
    from .tuners.registry import registered_algorithms

    entries = registered_algorithms()
    builtins = Table("name", "also accepted (any case)", "type", "className", title="built-in")
    for kind, known, names in (("tuner", TUNERS, TUNER_NAMES), ("assessor", ASSESSORS, ASSESSOR_NAMES)):
        for nni_name in dict.fromkeys(names.values()):
            keys = [k for k, v in names.items() if v == nni_name]
            factory = known[keys[0]][0]
            also = ", ".join(k for k in keys if k != nni_name.lower())
            builtins.add_row(nni_name, also, kind, f"{factory.__module__}.{factory.__qualname__}")
    console.print(builtins)
    table = Table("name", "type", "className", "classArgsValidator", "code directory", title="registered")
    for e in entries:
        table.add_row(e.builtin_name, e.algo_type, e.class_name, e.class_args_validator or "", e.code_directory or "")
    console.print(table)


@algo_app.command("unregister")
def algo_unregister(name: str) -> None:
    """Forget a registered algorithm (its files stay where they are)."""
    from .tuners.registry import unregister

    entry = unregister(name)
    console.print(f"unregistered {entry.algo_type} {entry.builtin_name}")


@tensorboard_app.command("start")
def tensorboard_start(experiment_id: str, root: RootOpt = None,
                      trials: Annotated[str | None, typer.Option("--trials", "--trial_id", help="trial ids, comma "
                                                                 "separated (default: every trial)")] = None,
                      port: Annotated[int, typer.Option("--port", help="0: any free port")] = 6006,
                      host: Annotated[str, typer.Option("--host")] = "127.0.0.1") -> None:
    """Start a TensorBoard over the trials' logs; it serves until `tensorboard stop`. Remote
    trials' logs are copied here first (run start again to refresh them)."""
    from .presentation import tensorboard

    base, store = _store(experiment_id, root)
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
    from .presentation import tensorboard

    base, _ = _store(experiment_id, root)
    server = tensorboard.stop(base / experiment_id)
    console.print(f"stopped the TensorBoard at {server.url}", highlight=False)


@app.command()
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
    live_port = _dashboard_port(dashboard, dashboard_port)
    base, store = _store(experiment_id, _in_experiment_dir(experiment_id, root, experiment_dir))
    if _control.controller_alive(store):
        raise CliError(f"experiment {experiment_id} is still running (pid {store.experiment().controller_pid})")
    for line in _control.extend_budget(store, trialnum, duration):
        console.print(line, highlight=False)
    if port is not None or url_prefix is not None:
        _use_kept_server(port, url_prefix)
    if debug:
        _experiments.set_stored_fields(store, {"logLevel": "debug"})
    _control.clear_run_requests(store)
    _launch(experiment_id, base, None, foreground, dashboard, live_port, earlier_run=store.experiment().flow_run_id)


@app.command("_run", hidden=True)
def run_detached(experiment_id: str, root: Annotated[Path, typer.Option("--root")],
                 config: Annotated[str | None, typer.Option("--config")] = None) -> None:
    _use_kept_server()  # before Prefect is imported: every thread of the controller reports to it
    if run_to_exit_code(experiment_id, root, config):
        raise typer.Exit(1)


@app.command()
def view(experiment_id: str, root: RootOpt = None, dashboard: DashboardOpt = False,
         dashboard_port: DashboardPortOpt = None, experiment_dir: ExperimentDirOpt = None,
         url_prefix: UrlPrefixOpt = None) -> None:
    """Show an experiment's status, budget and best trial (read-only); with --url_prefix, its Prefect UI
    page on the local server serving its UI there."""
    live_port = _dashboard_port(dashboard, dashboard_port)
    base, store = _store(experiment_id, _in_experiment_dir(experiment_id, root, experiment_dir))
    if url_prefix is not None:
        _use_kept_server(url_prefix=url_prefix)
    _views.print_experiment(console, store)
    if url_prefix is not None:
        console.print(_prefect_ui_line(store.experiment()), soft_wrap=True)
    if dashboard:
        _serve_until_interrupted(_start_dashboard(experiment_id, base, live_port))


@app.command("dashboard")
def dashboard_command(experiment_id: str, port: Annotated[int | None, typer.Option(
                          "--port", "-p", help="its port (default 8080; 0: any free one)")] = None,
                      host: Annotated[str, typer.Option("--host", help="address to bind; anyone who can reach "
                                                        "it can read and edit the study")] = "127.0.0.1",
                      storage: Annotated[str | None, typer.Option("--storage", help="Optuna storage URL for "
                                                                  "the study (default: a journal file in the "
                                                                  "experiment's directory)")] = None,
                      root: RootOpt = None) -> None:
    """Serve a live optuna-dashboard of a running or finished experiment (until Ctrl-C)."""
    base, _ = _store(experiment_id, root)
    if host not in ("127.0.0.1", "localhost", "::1"):
        console.print(f"[yellow]warning:[/] the dashboard listens on {escape(host)}: it has no login, anyone who "
                      "can reach that address can read and edit the study", markup=True)
    _serve_until_interrupted(_start_dashboard(experiment_id, base, _dashboard_port(True, port), host, storage))


@app.command()
def stop(experiment_id: Annotated[str | None, typer.Argument()] = None,
         all_: Annotated[bool, typer.Option("--all", "-a", help="stop every running experiment")] = False,
         root: RootOpt = None,
         wait: Annotated[float, typer.Option(help="seconds to wait for the controller")] = 60.0,
         port: Annotated[int | None, typer.Option("--port", "-p", help="the running experiment that reports to "
                                                  "the Prefect server on this port (nnictl's web UI port)")] = None,
         ) -> None:
    """Stop an experiment (default: the only running one; `all` or --all: every running one; --port: the
    one whose Prefect server is on that port): running trials are cancelled (USER_CANCELED), status STOPPED."""
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
        on_port = [e for e in _experiments.list_experiments(root, unreadable)
                   if e.record.status in EXPERIMENT_LIVE and _api_port(e.record.prefect_api) == port]
        if len(on_port) > 1:
            raise CliError(f"{len(on_port)} running experiments report to the Prefect server on port {port} "
                           f"({', '.join(e.id for e in on_port)}): give the id of one, or --all")
        if not on_port:
            raise CliError(f"no running experiment reports to a Prefect server on port {port}: `trialflow "
                           "experiment list` shows the running ones")
        targets = [(on_port[0].root, _experiments.open_store(on_port[0].root, on_port[0].id))]
    else:
        targets = [_store(experiment_id, root)]
    _report_unreadable(unreadable)
    if not targets:
        console.print("no experiment is running: nothing to stop")
    for base, store in targets:
        _warn(_control.stop_experiment(store, base, wait))
        console.print(f"experiment {store.experiment_id} stopped")


def _api_port(api: str | None) -> int | None:
    from urllib.parse import urlsplit

    try:
        return urlsplit(api).port if api else None
    except ValueError:
        return None


def _when_applied(store: ExperimentStore) -> str:
    """When an update takes effect: now for a running experiment, else at its next run."""
    if _control.controller_alive(store):
        return ""
    return f"; it takes effect when the experiment runs again: trialflow resume {store.experiment_id}"


def _update(experiment_id: str | None, what: str, value: str, root: Path | None) -> None:
    _, store = _store(experiment_id, root)
    number = _control.update_experiment(store, what, value)
    if what == "duration":
        console.print(f"maxExperimentDuration of {store.experiment_id} set to {number} s{_when_applied(store)}")
    else:
        console.print(f"{what} of {store.experiment_id} set to {number}{_when_applied(store)}")


ValueArg = Annotated[str | None, typer.Argument(metavar="[VALUE]", help="the new value (or --value)",
                                               show_default=False)]
ValueOpt = Annotated[str | None, typer.Option("--value", "-v", help="the new value")]


def _value_of(positional: str | None, option: str | None) -> str:
    if (positional is None) == (option is None):
        raise CliError("give the new value once: --value VALUE (or after the experiment id)")
    return str(positional if positional is not None else option)


@update_app.command("concurrency")
def update_concurrency(experiment_id: ExpIdArg = None, value: ValueArg = None, value_opt: ValueOpt = None,
                       root: RootOpt = None) -> None:
    """Set trialConcurrency (1-1000)."""
    _update(experiment_id, "concurrency", _value_of(value, value_opt), root)


@update_app.command("trialnum")
def update_trialnum(experiment_id: ExpIdArg = None, value: ValueArg = None, value_opt: ValueOpt = None,
                    root: RootOpt = None) -> None:
    """Set maxTrialNumber."""
    _update(experiment_id, "trialnum", _value_of(value, value_opt), root)


@update_app.command("duration")
def update_duration(experiment_id: ExpIdArg = None, value: ValueArg = None, value_opt: ValueOpt = None,
                    root: RootOpt = None) -> None:
    """Set maxExperimentDuration ('30m', '2h', seconds)."""
    _update(experiment_id, "duration", _value_of(value, value_opt), root)


@update_app.command("searchspace")
def update_searchspace(experiment_id: ExpIdArg = None,
                       filename: Annotated[Path, typer.Option("--filename", "-f", help="the new search space "
                                                              "(JSON)")] = Path("search_space.json"),
                       root: RootOpt = None) -> None:
    """Replace the search space of a running experiment: later trials take their parameters from it
    (the tuner is rebuilt and told the results so far that fit it); running trials keep theirs."""
    from .search_space import SearchSpaceError

    _, store = _store(experiment_id, root)
    try:
        _control.update_search_space(store, json.loads(filename.read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise CliError(f"file {filename} does not exist") from None
    except RecursionError:
        raise CliError(f"{filename} is not a valid search space: it nests deeper than can be read") from None
    except (ValueError, SearchSpaceError) as exc:
        raise CliError(f"{filename} is not a valid search space: {exc}") from None
    console.print(f"search space of {store.experiment_id} updated from {filename}; later trials use it"
                  f"{_when_applied(store)}", highlight=False)


# ---- experiments ----------------------------------------------------------------------------


@experiment_app.command("list")
def experiment_list(root: RootOpt = None,
                    all_: Annotated[bool, typer.Option("--all", help="every experiment, not only running "
                                                       "ones")] = False) -> None:
    """Running experiments with their status (as nnictl); --all: every known experiment."""
    from rich.table import Table

    table = Table("id", "name", "status", "trials", "started", "directory")
    unreadable: list[str] = []
    for e in _experiments.list_experiments(root, unreadable):
        if not all_ and e.record.status not in EXPERIMENT_LIVE:
            continue
        store = _experiments.open_records(e.root, e.id)
        count = store.count_trials()
        store.close()
        started = time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(e.record.start_time or 0))
        table.add_row(e.id, e.record.name or "", e.record.status, str(count), started, str(e.root / e.id))
    console.print(table)
    _report_unreadable(unreadable)


def _report_unreadable(unreadable: list[str]) -> None:
    for line in unreadable:
        console.print(f"[yellow]skipped[/] {escape(line)}", markup=True, highlight=False, soft_wrap=True)


@experiment_app.command("show")
def experiment_show(experiment_id: ExpIdArg = None, root: RootOpt = None) -> None:
    """The experiment's status and config as JSON: each value once, as in force (``update`` and
    ``resume --trialnum/--duration`` included), then the history of those changes and where the tuner's
    imported results came from."""
    _, store = _store(experiment_id, root)
    record = store.experiment()
    config, controls = _records.config_in_force(record)
    history = [{"time": datetime.fromtimestamp(u.time, timezone.utc).isoformat(timespec="seconds"),
                "field": _records.CONTROLLED_FIELDS.get(u.control, u.control), "value": u.value, "via": u.via}
               for u in store.updates()]
    imported = [{"source": source or "experiment import", "results": count}
                for source, count in store.imported_sources().items()]
    typer.echo(json.dumps({"id": record.id, "status": record.status, "message": record.message,
                           "config": config, "controls": controls, "updates": history, "imported": imported},
                          indent=2))


@experiment_app.command("export")
def experiment_export(
                      filename: Annotated[Path, typer.Option("--filename", "-f", help="output file")],
                      kind: Annotated[str, typer.Option("--type", "-t", help="json or csv")] = "json",
                      intermediate: Annotated[bool, typer.Option("--intermediate", "-i")] = False,
                      experiment_id: ExpIdArg = None, root: RootOpt = None) -> None:
    """Export trials (parameters, final value, optionally intermediates) as JSON or CSV."""
    if kind not in ("json", "csv"):
        raise CliError(f"bad --type {kind!r}: use json or csv")
    _, store = _records_only(experiment_id, root)
    from .result_exchange import export_results

    console.print(f"exported {export_results(store, filename, kind, intermediate)} trials to {filename}")


@experiment_app.command("import")
def experiment_import(
                      filename: Annotated[Path, typer.Option("--filename", "-f", help="JSON list of "
                                                             "{parameter, value}")],
                      experiment_id: ExpIdArg = None, root: RootOpt = None) -> None:
    """Import results ([{parameter, value}]) for the tuner, as NNI's importData: told to it on every (re)start;
    they are not trials (no budget, never the best trial). All items or none."""
    from .result_exchange import import_rows

    _, store = _store(experiment_id, root)
    experiment_id = store.experiment_id
    try:
        size = filename.stat().st_size
        if size > MAX_IMPORT_BYTES:
            raise CliError(f"{filename} is {size} bytes; an import file may hold at most {MAX_IMPORT_BYTES}")
        data = json.loads(filename.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CliError(f"file {filename} does not exist") from None
    except (ValueError, RecursionError) as exc:
        raise CliError(f"{filename} is not valid JSON: {exc or 'nested too deeply'}") from None
    try:
        count = import_rows(store, data)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    console.print(f"imported {count} result{'s' if count != 1 else ''} for the tuner of {experiment_id} "
                  "(not trials: they count toward no budget)")


@experiment_app.command("optuna")
def experiment_optuna(
                      storage: Annotated[str, typer.Option("--storage", help="Optuna storage URL, e.g. "
                                                           "sqlite:///study.db")],
                      study: Annotated[str | None, typer.Option("--study", help="study name")] = None,
                      experiment_id: ExpIdArg = None, root: RootOpt = None) -> None:
    """Copy the experiment into an Optuna study (then: optuna-dashboard <storage>). Running it again
    brings the same study up to date."""
    from .presentation.dashboard import open_mirror

    _, store = _store(experiment_id, root)
    mirror = open_mirror(store, storage, study or f"trialflow-{store.experiment_id}")
    mirror.sync()
    console.print(f"study {mirror.study_name!r} with {mirror.trial_count} trials in {storage}; "
                  f"open it with: optuna-dashboard {storage}")


@experiment_app.command("report")
def experiment_report(
                      output: Annotated[Path, typer.Option("--output", "-o", help="the HTML file to write")],
                      experiment_id: ExpIdArg = None, root: RootOpt = None) -> None:
    """Write one self-contained HTML file with the experiment's charts (opens offline)."""
    from .presentation.report import write_report

    _, store = _store(experiment_id, root)
    try:
        drawn = write_report(store, output)
    except ImportError as exc:
        raise CliError(str(exc)) from None
    console.print(f"wrote {output}: {sum(why is None for why in drawn.values())} of {len(drawn)} charts")
    for title, why in drawn.items():
        if why is not None:
            console.print(f"  {title}: {why}", highlight=False)


@experiment_app.command("delete")
def experiment_delete(experiment_id: ExpIdArg = None, root: RootOpt = None,
                      all_: Annotated[bool, typer.Option("--all", help="delete every experiment that is not "
                                                         "running")] = False,
                      yes: Annotated[bool, typer.Option("--yes", "-y")] = False) -> None:
    """Delete a finished experiment's directory (trials, logs, store); --all: every one not running."""
    if all_ and experiment_id:
        raise CliError("give an experiment id or --all, not both")
    if all_:
        targets = [(e.root, _experiments.open_store(e.root, e.id)) for e in _experiments.list_experiments(root)]
        targets = [(base, store) for base, store in targets if not _control.controller_alive(store)]
    else:
        base, store = _store(experiment_id, root)
        _control.ensure_not_running(store)  # before asking; delete_experiment checks again after
        targets = [(base, store)]
    if not targets:
        console.print("no experiment to delete")
        return
    folders = ", ".join(str(base / store.experiment_id) for base, store in targets)
    if not yes and not typer.confirm(f"delete {folders}?"):
        for _, store in targets:
            store.close()
        raise typer.Exit(1)
    for base, store in targets:
        console.print(f"deleted {_control.delete_experiment(store, base).name}")


@experiment_app.command("status")
def experiment_status(experiment_id: ExpIdArg = None, root: RootOpt = None) -> None:
    """The experiment's status as JSON ({"status", "errors"}), as nnictl prints it."""
    _, store = _store(experiment_id, root)
    record = store.experiment()
    errors = [record.message] if record.status == ExperimentStatus.ERROR and record.message else []
    typer.echo(json.dumps({"status": record.status, "errors": errors}, indent=4, sort_keys=True))


@experiment_app.command("save")
def experiment_save(experiment_id: ExpIdArg = None,
                    path: Annotated[Path, typer.Option("--path", "-p", help="the folder to write the package to")]
                    = Path("."),
                    save_code: Annotated[bool, typer.Option("--saveCodeDir", "-s", help="also pack the trial "
                                                            "code folder")] = False,
                    force: Annotated[bool, typer.Option("--force", help="replace a package already there")]
                    = False,
                    root: RootOpt = None) -> None:
    """Pack a stopped or finished experiment (store, trial folders, logs; --saveCodeDir: its code
    folders, as its trials get them) into one file that `experiment load` unpacks elsewhere."""
    from .experiment_archive import save_experiment

    base, store = _store(experiment_id, root)
    if _control.controller_alive(store):
        raise CliError(f"experiment {store.experiment_id} is running; stop it first (its store is being written)")
    written = save_experiment(store, base / store.experiment_id, path, save_code, force)
    console.print(f"saved experiment {store.experiment_id} to {written}", highlight=False, soft_wrap=True)


@experiment_app.command("load")
def experiment_load(path: Annotated[Path, typer.Option("--path", "-p", help="the package `experiment save` "
                                                       "wrote")],
                    code_dir: Annotated[Path, typer.Option("--codeDir", "-c", help="where the trial code is (or "
                                                           "goes, from a package saved with --saveCodeDir)")],
                    log_dir: Annotated[Path | None, typer.Option("--logDir", "-l", help="the working directory "
                                                                 "to load it into (default: the default "
                                                                 "one)")] = None,
                    search_space: Annotated[Path | None, typer.Option("--searchSpacePath", "-s", help="a search "
                                                                      "space file to use from now on")] = None
                    ) -> None:
    """Unpack an experiment package; it can then be viewed, exported and resumed here."""
    from .experiment_archive import ArchiveError, load_experiment
    from .experiments import default_root

    try:
        experiment_id = load_experiment(path, code_dir, log_dir or default_root(), search_space)
    except (ArchiveError, OSError) as exc:
        raise CliError(str(exc)) from None
    console.print(f"loaded experiment {experiment_id}; view it: trialflow view {experiment_id}", highlight=False)


# ---- trials ---------------------------------------------------------------------------------


@trial_app.command("ls")
def trial_ls(experiment_id: ExpIdArg = None, head: Annotated[int | None, typer.Option("--head")] = None,
             tail: Annotated[int | None, typer.Option("--tail")] = None, root: RootOpt = None) -> None:
    """Trials with status and final metric; --head/--tail N sort by metric (best/worst first)."""
    if head is not None and tail is not None:
        raise CliError("use either --head or --tail")
    _, store = _records_only(experiment_id, root)
    trials = store.trials()
    if head is not None or tail is not None:
        trials = _views.sort_trials(trials, store, head, tail)
    _views.print_trials(console, trials, _results.multi_objective(store.experiment()))


def _ids(experiment_id: str | None, trial: str | None, trial_id: str | None) -> tuple[str | None, str]:
    """(experiment id, trial id) from nnictl's ``[ID] --trial_id T`` or trialflow's ``ID TRIAL``; a lone
    positional that is a trial id names the trial of the only running experiment."""
    if (trial_id is None and trial is None and experiment_id is not None
            and not looks_like_experiment_id(experiment_id)):
        experiment_id, trial = None, experiment_id
    if (trial is None) == (trial_id is None):
        raise CliError("give the trial once: --trial_id TRIAL (or after the experiment id)")
    return experiment_id, str(trial or trial_id)


@trial_app.command("kill")
def trial_kill(experiment_id: ExpIdArg = None,
               trial_arg: Annotated[str | None, typer.Argument(metavar="[TRIAL]", show_default=False)] = None,
               trial_id: TrialIdOpt = None, root: RootOpt = None) -> None:
    """Cancel one trial (USER_CANCELED)."""
    experiment_id, trial_id = _ids(experiment_id, trial_arg, trial_id)
    base, store = _store(experiment_id, root)
    try:
        ended, warnings = _control.kill_trial(store, base, trial_id)
    except KeyError as exc:
        raise CliError(str(exc).strip("'\"")) from None
    _warn(warnings)
    if ended is not None:
        console.print(f"trial {trial_id} already ended ({ended})")
        return
    console.print(f"trial {trial_id} cancelled")


@log_app.command("trial")
def log_trial(experiment_id: ExpIdArg = None,
              trial_arg: Annotated[str | None, typer.Argument(metavar="[TRIAL]", show_default=False)] = None,
              trial_id: TrialIdOpt = None, root: RootOpt = None,
              tail: Annotated[int | None, typer.Option("--tail", help="last N bytes of each log")] = None) -> None:
    """Print a trial's stdout, stderr and trial.log (fetched from the worker for remote trials); without
    a trial, as nnictl, each trial's id, status and log folder."""
    if trial_arg is None and trial_id is None and (experiment_id is None or looks_like_experiment_id(experiment_id)):
        _, store = _store(experiment_id, root)
        for trial in store.trials():
            typer.echo(f"{trial.id}  {trial.status:<13}  {trial.log_dir or '(not submitted: no logs)'}")
        return
    experiment_id, trial_id = _ids(experiment_id, trial_arg, trial_id)
    base, store = _store(experiment_id, root)
    try:
        trial = store.trial(trial_id)
    except KeyError as exc:
        raise CliError(str(exc).strip("'\"")) from None
    if not trial.handle:
        raise CliError(f"trial {trial_id} was never submitted, so it has no logs")
    handle = _platforms.TrialHandle.from_dict(trial.handle)
    service = _control.open_service(store, base)
    try:
        logs = service.logs(handle, tail)
    except _platforms.PlatformError as exc:
        raise CliError(f"cannot fetch the logs of trial {trial_id}: {exc}") from None
    finally:
        service.close()
    for name, text in logs.items():
        console.rule(name)
        typer.echo(text)


# ---- the kept local Prefect server ---------------------------------------------------------------

server_app = typer.Typer(help="trialflow's kept local Prefect server and its UI (used when PREFECT_API_URL is "
                         "not set).", no_args_is_help=True)
app.add_typer(server_app, name="server")


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
    from .kept_server import ensure_server, running_server, server_choice

    already = running_server()
    server = ensure_server(**server_choice(port, url_prefix))
    _print_server(server, "already running" if already else "started")
    _configured_api_note()


@server_app.command("env")
def server_env() -> None:
    """The shell line that points this shell's `prefect` commands and Python at the kept server (started
    when none runs): eval "$(trialflow server env)"."""
    from prefect.settings import PREFECT_API_URL

    from .kept_server import ensure_server, running_server

    configured = PREFECT_API_URL.value()
    current = running_server()
    if configured and (current is None or configured != current.url):
        raise CliError(f"PREFECT_API_URL is set to {configured}: this shell reports there; unset it to use "
                       "trialflow's local Prefect server")
    server = ensure_server()
    server.wait_until_healthy()
    typer.echo("export " + " ".join(f"{name}={shlex.quote(value)}" for name, value in server.client_settings().items()))


@server_app.command("status")
def server_status() -> None:
    """Whether the kept server runs and answers (exit code 1 when it does not run)."""
    from .kept_server import running_server

    server = running_server()
    if server is None:
        console.print("Prefect server: not running (experiments start it; or: trialflow server start)")
        _configured_api_note()
        raise typer.Exit(1)
    healthy = server.healthy()
    _print_server(server, "running" if healthy else "starting or not answering")
    from .spare_controller import SPARE_SETTING
    from .spare_record import recorded_spare

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
    from .kept_server import running_server, stop_server

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


# ---- the rest of nnictl ------------------------------------------------------------------------

platform_app = typer.Typer(help="Clean up what trialflow left on training platforms.", no_args_is_help=True)
webui_app = typer.Typer(help="Where to watch an experiment: its Prefect UI page and live dashboard.",
                        no_args_is_help=True)
package_app = typer.Typer(help="Install what a built-in algorithm needs (NNI's nnictl package).", no_args_is_help=True)
app.add_typer(platform_app, name="platform")
app.add_typer(webui_app, name="webui")
app.add_typer(package_app, name="package")
algo_app.command("reg", hidden=True)(algo_register)  # nnictl's aliases
algo_app.command("unreg", hidden=True)(algo_unregister)


def _version(value: bool) -> None:
    if value:
        from . import __version__

        typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def _options(version: Annotated[bool, typer.Option("--version", "-v", callback=_version, is_eager=True,
                                                   help="print trialflow's version")] = False) -> None:
    """Hyperparameter-tuning experiments on Prefect (NNI-compatible)."""


@app.command()
def top(interval: Annotated[int, typer.Option("--time", "-t", help="seconds between refreshes")] = 3,
        root: RootOpt = None) -> None:
    """Watch the running experiments and their trials, refreshed every --time seconds (Ctrl-C quits)."""
    from rich.live import Live

    from .presentation.views import running_table

    if interval < 1:
        raise CliError(f"bad --time {interval}: give at least 1 second")
    _interrupt_on_signals()
    try:
        console.print(f"running experiments, every {interval} s; Ctrl-C quits", highlight=False)
        with Live(running_table(root), console=console, auto_refresh=False) as live:
            while True:
                time.sleep(interval)
                live.update(running_table(root), refresh=True)
    except KeyboardInterrupt:
        console.print()


@config_app.command("show")
def config_show(experiment_id: ExpIdArg = None, root: RootOpt = None) -> None:
    """The experiment's config as YAML, with the values in force (``update`` included; the password of
    a shared store left out)."""
    import yaml

    _, store = _store(experiment_id, root)
    config, _ = _records.config_in_force(store.experiment())
    typer.echo(yaml.safe_dump(config, sort_keys=False, allow_unicode=True), nl=False)


def _log_file(experiment_id: str | None, root: Path | None, name: str) -> Path:
    base, store = _store(experiment_id, root)
    return base / store.experiment_id / "log" / name


def _print_log(path: Path, head: int | None, tail: int | None, path_only: bool) -> None:
    if path_only:
        typer.echo(str(path))
        return
    if not path.is_file():
        raise CliError(f"{path} does not exist (yet)")
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    lines = lines[:head] if head is not None else lines[-tail:] if tail is not None else lines
    typer.echo("\n".join(lines))


HeadOpt = Annotated[int | None, typer.Option("--head", "-H", help="the first N lines")]
TailOpt = Annotated[int | None, typer.Option("--tail", "-T", help="the last N lines")]
PathOpt = Annotated[bool, typer.Option("--path", help="print the file's path only")]


@log_app.command("stdout")
def log_stdout(experiment_id: ExpIdArg = None, head: HeadOpt = None, tail: TailOpt = None, path: PathOpt = False,
               root: RootOpt = None) -> None:
    """The experiment controller's log (log/experiment.log: the run's and its trials' records)."""
    _print_log(_log_file(experiment_id, root, Path(_experiments.CONTROLLER_LOG).name), head, tail, path)


@log_app.command("stderr")
def log_stderr(experiment_id: ExpIdArg = None, head: HeadOpt = None, tail: TailOpt = None, path: PathOpt = False,
               root: RootOpt = None) -> None:
    """What a background controller printed besides its log (log/controller.out: tracebacks, warnings)."""
    _print_log(_log_file(experiment_id, root, CONTROLLER_OUTPUT), head, tail, path)


def _prefect_ui_line(record: ExperimentRecord) -> str:
    """The line naming the Prefect UI page of the experiment's latest flow run."""
    from .kept_server import flow_run_page, sign_in_note

    page = flow_run_page(record.prefect_api, record.flow_run_id)
    return f"Prefect UI: {page}{sign_in_note(record.prefect_api)}" if page else (
        "Prefect UI: none (the run used Prefect's temporary server, which has no UI; without "
        "TRIALFLOW_PREFECT_SERVER=temporary runs get trialflow's kept server and its UI)")


@webui_app.command("url")
def webui_url(experiment_id: ExpIdArg = None, root: RootOpt = None) -> None:
    """The experiment's Prefect UI page (its flow run) and its live dashboard's address, when serving.
    (NNI's web UI is Prefect's UI and optuna-dashboard here.)"""
    from .store import Control

    _, store = _store(experiment_id, root)
    record = store.experiment()
    console.print(_prefect_ui_line(record), soft_wrap=True)
    dashboard = record.controls.get(Control.DASHBOARD_URL)
    console.print(f"dashboard: {dashboard}" if dashboard else
                  f"dashboard: none serving (trialflow dashboard {record.id})", soft_wrap=True)


@platform_app.command("clean")
def platform_clean(config: Annotated[Path, typer.Option("--config", "-c", help="the experiment config naming the "
                                                        "platform (its machines, cluster storage)")],
                   yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask")] = False) -> None:
    """Remove what trialflow made on the config's platform for every experiment (the code bundles,
    runtimes and experiment folders it marked as its own under remoteWorkingDirectory or on the share),
    after listing them. Nothing else there is touched. Trials still running there lose their folders:
    stop them first."""
    import tempfile

    cfg = _config.load_config(config)
    names = ", ".join(s.platform for s in cfg.services)
    with tempfile.TemporaryDirectory() as scratch:
        service = _platforms.experiment_service(cfg, Path(scratch) / "platform-clean")
        try:
            planned = service.clean(dry_run=True)
            if not planned:
                console.print(f"{names}: nothing there is trialflow's to remove", highlight=False)
                return
            for where in planned:
                console.print(f"trialflow's: {where}", soft_wrap=True, highlight=False)
            if not yes and not typer.confirm(f"remove the {len(planned)} listed above?"):
                raise typer.Exit(1)
            removed = service.clean()
        finally:
            service.close()
    for where in removed:
        console.print(f"removed {where}", soft_wrap=True, highlight=False)


@algo_app.command("show")
def algo_show(name: str) -> None:
    """One algorithm: a registered one's meta (as `algo register` took it), or a built-in's classArgs."""
    import yaml

    from .assessors import ASSESSORS
    from .tuners import TUNERS
    from .tuners.registry import registered

    entry = registered(name)
    if entry is not None:
        meta = {"builtinName": entry.builtin_name, "algoType": entry.algo_type, "className": entry.class_name,
                "classArgsValidator": entry.class_args_validator, "codeDirectory": entry.code_directory}
        typer.echo(yaml.safe_dump({k: v for k, v in meta.items() if v is not None}, sort_keys=False), nl=False)
        return
    for kind, table in (("tuner", TUNERS), ("assessor", ASSESSORS)):
        if name.lower() in table:
            allowed = sorted(table[name.lower()][1])
            typer.echo(yaml.safe_dump({"builtinName": name, "algoType": kind, "source": "trialflow",
                                       "classArgs": allowed, "extra": _extra_of(name)}, sort_keys=False), nl=False)
            return
    raise CliError(f"no algorithm {name!r}: `trialflow algo list` shows the registered ones; built-in tuners: "
                   "TPE, Random, Anneal, Evolution, GridSearch, Batch, CMAES, GP; assessors: Medianstop, "
                   "Curvefitting")


def _extra_of(name: str) -> str | None:
    from .tuners import NEEDS

    need = NEEDS.get(name.lower())
    return f"trialflow[{need[2]}]" if need else None


@package_app.command("show")
def package_show() -> None:
    """Built-in algorithms that need an optional package, and whether it is installed."""
    import importlib.util

    from .tuners import NEEDS

    for name, (module, what, extra) in sorted(NEEDS.items()):
        state = "installed" if importlib.util.find_spec(module) is not None else "not installed"
        console.print(f"{name}: needs {what} (pip install 'trialflow[{extra}]'): {state}", highlight=False)


@package_app.command("install")
def package_install(name: str) -> None:
    """Install the pip extra the built-in algorithm NAME needs (e.g. BOHB: statsmodels); pip's own log
    is shown only when it fails."""
    from .tuners import NAS_TUNERS, NEEDS, TUNERS

    key = name.lower()
    if key in {n.lower() for n in NAS_TUNERS}:
        raise CliError(f"{name} is one of NNI's neural architecture search tuners, out of trialflow's scope; "
                       "nothing to install")
    if key not in TUNERS:
        raise CliError(f"no built-in algorithm {name!r}; `trialflow package show` lists those that need a package")
    if key not in NEEDS:
        console.print(f"{name} needs no extra package: it is ready to use", highlight=False)
        return
    extra = f"trialflow[{NEEDS[key][2]}]"
    console.print(f"pip install '{extra}' ...", highlight=False)
    result = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                             extra], check=False, capture_output=True, text=True)
    if result.returncode:
        sys.stderr.write(result.stdout[-4000:] + result.stderr[-4000:])
        raise CliError(f"pip install '{extra}' failed (exit {result.returncode}); pip's output is above")
    console.print(f"{name}: {NEEDS[key][1]} installed", highlight=False)


@app.command("ss_gen")
def ss_gen(trial_command: Annotated[str | None, typer.Option("--trial_command", "-t")] = None,
           trial_dir: Annotated[str | None, typer.Option("--trial_dir", "-d")] = None,
           file: Annotated[str | None, typer.Option("--file", "-f")] = None) -> None:
    """NNI's search-space generation from annotated trial code: annotations were removed in NNI 3.0 and
    trialflow has none, so there is nothing to generate. Write the space as JSON (searchSpace or
    searchSpaceFile) and read parameters with nni.get_next_parameter()."""
    raise CliError("ss_gen generated search spaces from NNI annotations, which NNI 3.0 removed and trialflow does "
                   "not have: write the search space as JSON (searchSpaceFile) and read it with "
                   "nni.get_next_parameter()")



def _show_warning(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None,
                  line: str | None = None) -> None:
    """Config warnings as one line, each once (the config may be read twice: by the command and its run);
    others as Python prints them."""
    from .kept_server import OpenServerWarning

    if issubclass(category, _config.ConfigWarning | OpenServerWarning):
        if str(message) in _WARNED:
            return
        _WARNED.add(str(message))
        console.print(f"[yellow]warning:[/] {escape(str(message))}", markup=True, highlight=False, soft_wrap=True)
    else:
        _default_show_warning(message, category, filename, lineno, file, line)


def main() -> None:
    """Console entry point: one-line errors, exit code 1."""
    from .kept_server import set_process_defaults

    warnings.showwarning = _show_warning
    set_process_defaults()
    try:
        code = app(standalone_mode=False)
    except UserError as exc:  # CliError and every domain error a user can fix: one line, exit 1
        console.print(f"[red]error:[/] {escape(str(exc))}", markup=True, highlight=False, soft_wrap=True)
        sys.exit(1)
    except typer.Abort:
        sys.exit(1)
    except Exception as exc:
        if (full := no_space(exc)) is not None:  # any command on a full disk: one line too
            console.print(f"[red]error:[/] no space left on the device ({escape(str(full))}): free space, then run "
                          "the command again", markup=True, highlight=False, soft_wrap=True)
            sys.exit(1)
        if not (hasattr(exc, "show") and hasattr(exc, "exit_code")):
            raise
        exc.show()  # bad usage (click's exception, vendored by typer): its own message
        sys.exit(exc.exit_code)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
