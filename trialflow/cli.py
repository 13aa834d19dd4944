"""``trialflow``: nnictl-style commands (typer + rich).

Errors exit non-zero with one ``error:`` line naming what is wrong and how to fix it (config errors
list one line per bad field). Experiments run in a detached background process by default, like
``nnictl create``; ``--foreground`` runs in this terminal with a live progress display.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from .config import ConfigError, ConfigWarning, convert_config_file, load_config, parse_duration
from .experiments import (
    CONTROLLER_LOG,
    ExperimentNotFound,
    create_experiment,
    find_experiment,
    list_experiments,
    load_experiment_config,
    open_store,
)
from .platforms import PlatformError, TrainingService, TrialHandle, TrialStatus, experiment_service
from .results import end_experiment
from .store import ExperimentStore, StoreUnreadable
from .trial.procs import pid_alive
from .tuners import TunerError
from .views import export_rows, print_experiment, print_trials, sort_trials

if TYPE_CHECKING:
    from .dashboard import LiveDashboard

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
console = Console()
_default_show_warning = warnings.showwarning

RootOpt = Annotated[Path | None, typer.Option("--root", help="experiment working directory to search")]
DashboardOpt = Annotated[bool, typer.Option("--dashboard", help="also serve a live optuna-dashboard of it "
                                            "(until Ctrl-C)")]
PortOpt = Annotated[int, typer.Option("--port", help="the dashboard's port (0: any free one)")]
DEFAULT_DASHBOARD_PORT = 8080
MAX_IMPORT_BYTES = 64 * 1024 * 1024  # an import file is read whole
CONTROLLER_OUTPUT = "controller.out"  # beside it: a background controller's raw output


class CliError(Exception):
    """A user-facing failure: printed as one line, exit code 1."""


def _fail(message: str) -> None:
    raise CliError(message)


def _store(experiment_id: str, root: Path | None) -> tuple[Path, ExperimentStore]:
    try:
        return find_experiment(experiment_id, root)
    except ExperimentNotFound as exc:
        raise CliError(str(exc)) from None


def _controller_alive(store: ExperimentStore) -> bool:
    pid = store.experiment().controller_pid
    return bool(pid) and pid != os.getpid() and pid_alive(int(pid))  # type: ignore[arg-type]


# ---- running experiments -----------------------------------------------------------------------


def _start_dashboard(experiment_id: str, root: Path, port: int, host: str = "127.0.0.1",
                     storage: str | None = None) -> LiveDashboard:
    from .dashboard import LiveDashboard, journal_storage, open_mirror

    store = open_store(root, experiment_id)
    try:
        mirror = open_mirror(store, storage or journal_storage(root / experiment_id))
        dashboard = LiveDashboard(store, mirror, host, port).start()
    except (ImportError, OSError) as exc:
        raise CliError(str(exc)) from None
    console.print(f"dashboard: [bold]{dashboard.url}[/]", soft_wrap=True)
    return dashboard


def _serve_until_interrupted(dashboard: LiveDashboard) -> None:
    """Keep serving until Ctrl-C or SIGTERM, then stop the dashboard cleanly."""
    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    console.print("serving the dashboard; Ctrl-C stops it")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        dashboard.stop()


def _launch(experiment_id: str, root: Path, config_path: str | None, foreground: bool, dashboard: bool = False,
            port: int = DEFAULT_DASHBOARD_PORT) -> None:
    live = _start_dashboard(experiment_id, root, port) if dashboard else None
    if foreground:
        from .live import run_with_progress

        try:
            status, failure = run_with_progress(experiment_id, root, config_path, console)
        except BaseException as exc:
            if live is not None:
                live.stop()
            if isinstance(exc, PlatformError | ConfigError | TunerError):  # stored as ERROR with it too
                raise CliError(f"experiment {experiment_id} could not run: {exc}") from None
            raise
        if live is not None:
            console.print(f"experiment {experiment_id} ended {status}")
            _serve_until_interrupted(live)
        if status != "DONE" or failure:
            raise CliError(failure or f"experiment {experiment_id} ended {status}")
        return
    log_path = root / experiment_id / CONTROLLER_LOG
    log_path.parent.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, "-m", "trialflow.cli", "_run", experiment_id, "--root", str(root)]
    if config_path:
        args += ["--config", config_path]
    # the flow writes its log records to log_path itself; this file catches what else is printed
    with open(log_path.parent / CONTROLLER_OUTPUT, "ab") as log:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    console.print(f"experiment [bold]{experiment_id}[/] started in the background (pid {proc.pid})")
    console.print(f"  progress: trialflow trial ls {experiment_id}   log: {log_path}")
    console.print(f"  stop:     trialflow stop {experiment_id}")
    if live is not None:
        _serve_until_interrupted(live)


@app.command()
def create(config: Annotated[Path, typer.Option("--config", "-c", help="experiment config (YAML/JSON)")],
           foreground: Annotated[bool, typer.Option("--foreground", "-f", help="run in this terminal")] = False,
           dashboard: DashboardOpt = False, port: PortOpt = DEFAULT_DASHBOARD_PORT) -> None:
    """Create an experiment from an NNI-style config file and start it."""
    try:
        cfg = load_config(config)
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    experiment_id, exp_dir = create_experiment(cfg, str(config.resolve()))
    console.print(f"experiment id: [bold]{experiment_id}[/]  directory: {exp_dir}")
    _launch(experiment_id, exp_dir.parent, str(config.resolve()), foreground, dashboard, port)


@config_app.command("convert")
def config_convert(config: Annotated[Path, typer.Argument(help="an NNI v1 config file (YAML/JSON)")],
                   output: Annotated[Path | None, typer.Option("--output", "-o", help="write it here instead of "
                                                               "printing it")] = None) -> None:
    """Print (or write) the NNI v2 equivalent of a v1 config file, checked by loading it. Relative
    paths stay as written: keep the result next to the original."""
    import yaml

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            converted = convert_config_file(config)
    except ConfigError as exc:
        raise CliError(str(exc)) from None
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
def algo_register(meta: Annotated[Path, typer.Option("--meta", "-m", help="NNI meta file: algoType, builtinName, "
                                                     "className[, classArgsValidator]")]) -> None:
    """Register a customized tuner or assessor; configs then name it like a built-in one. The meta
    file's folder is where its module is looked up."""
    from .assessors import ASSESSORS
    from .tuners import TUNERS
    from .tuners.custom import load_class
    from .tuners.registry import read_meta, register

    try:
        entry = read_meta(meta)
        load_class(entry.class_name, entry.code_directory, entry.builtin_name)
        if entry.class_args_validator:
            load_class(entry.class_args_validator, entry.code_directory, f"{entry.builtin_name} classArgsValidator")
        register(entry, set(TUNERS) | set(ASSESSORS))
    except TunerError as exc:
        raise CliError(str(exc)) from None
    console.print(f"registered {entry.algo_type} [bold]{entry.builtin_name}[/] ({entry.class_name}); use it as "
                  f"{entry.algo_type}: {{name: {entry.builtin_name}}}", highlight=False)


@algo_app.command("list")
def algo_list() -> None:
    """The registered algorithms."""
    from rich.table import Table

    from .tuners.registry import registered_algorithms

    try:
        entries = registered_algorithms()
    except TunerError as exc:
        raise CliError(str(exc)) from None
    table = Table("name", "type", "className", "classArgsValidator", "code directory")
    for e in entries:
        table.add_row(e.builtin_name, e.algo_type, e.class_name, e.class_args_validator or "", e.code_directory or "")
    console.print(table)


@algo_app.command("unregister")
def algo_unregister(name: str) -> None:
    """Forget a registered algorithm (its files stay where they are)."""
    from .tuners.registry import unregister

    try:
        entry = unregister(name)
    except TunerError as exc:
        raise CliError(str(exc)) from None
    console.print(f"unregistered {entry.algo_type} {entry.builtin_name}")


@tensorboard_app.command("start")
def tensorboard_start(experiment_id: str, root: RootOpt = None,
                      trials: Annotated[str | None, typer.Option("--trials", "--trial_id", help="trial ids, comma "
                                                                 "separated (default: every trial)")] = None,
                      port: Annotated[int, typer.Option("--port", help="0: any free port")] = 6006,
                      host: Annotated[str, typer.Option("--host")] = "127.0.0.1") -> None:
    """Start a TensorBoard over the trials' logs; it serves until `tensorboard stop`. Remote
    trials' logs are copied here first (run start again to refresh them)."""
    from . import tensorboard

    base, store = _store(experiment_id, root)
    wanted = [t.strip() for t in trials.split(",") if t.strip()] if trials else None
    service = _open_service(store, base)
    try:
        runs = tensorboard.trial_folders(store, service, wanted)
        server = tensorboard.start(base / experiment_id, runs, port, host)
    except tensorboard.TensorBoardError as exc:
        raise CliError(str(exc)) from None
    finally:
        service.close()
    if host not in ("127.0.0.1", "localhost", "::1"):
        console.print(f"[yellow]warning:[/] TensorBoard listens on {host}, with no login", highlight=False)
    console.print(f"TensorBoard of {len(runs)} trial(s) at {server.url} (pid {server.pid}); "
                  f"stop: trialflow tensorboard stop {experiment_id}", highlight=False)


@tensorboard_app.command("stop")
def tensorboard_stop(experiment_id: str, root: RootOpt = None) -> None:
    """Stop the experiment's TensorBoard."""
    from . import tensorboard

    base, _ = _store(experiment_id, root)
    try:
        server = tensorboard.stop(base / experiment_id)
    except tensorboard.TensorBoardError as exc:
        raise CliError(str(exc)) from None
    console.print(f"stopped the TensorBoard at {server.url}", highlight=False)


@app.command()
def resume(experiment_id: str, root: RootOpt = None,
           foreground: Annotated[bool, typer.Option("--foreground", "-f")] = False,
           dashboard: DashboardOpt = False, port: PortOpt = DEFAULT_DASHBOARD_PORT) -> None:
    """Resume a stopped or crashed experiment: re-attach running trials, keep counts."""
    base, store = _store(experiment_id, root)
    if _controller_alive(store):
        raise CliError(f"experiment {experiment_id} is still running (pid {store.experiment().controller_pid})")
    store.set_control("stop", False)
    store.set_control("kill", [])
    _launch(experiment_id, base, None, foreground, dashboard, port)


@app.command("_run", hidden=True)
def run_detached(experiment_id: str, root: Annotated[Path, typer.Option("--root")],
                 config: Annotated[str | None, typer.Option("--config")] = None) -> None:
    from .flows.experiment import experiment_flow, final_status

    state = experiment_flow(config, experiment_id, str(root), return_state=True)
    final_status(state)  # raises what ended a run that could not go on
    if state.is_failed():  # no trial succeeded: cron and automations see a non-zero exit
        raise typer.Exit(1)


@app.command()
def view(experiment_id: str, root: RootOpt = None, dashboard: DashboardOpt = False,
         port: PortOpt = DEFAULT_DASHBOARD_PORT) -> None:
    """Show an experiment's status, budget and best trial (read-only)."""
    base, store = _store(experiment_id, root)
    print_experiment(console, store)
    if dashboard:
        _serve_until_interrupted(_start_dashboard(experiment_id, base, port))


@app.command("dashboard")
def dashboard_command(experiment_id: str, port: PortOpt = DEFAULT_DASHBOARD_PORT,
                      host: Annotated[str, typer.Option("--host", help="address to bind; anyone who can reach "
                                                        "it can read and edit the study")] = "127.0.0.1",
                      storage: Annotated[str | None, typer.Option("--storage", help="Optuna storage URL for "
                                                                  "the study (default: a journal file in the "
                                                                  "experiment's directory)")] = None,
                      root: RootOpt = None) -> None:
    """Serve a live optuna-dashboard of a running or finished experiment (until Ctrl-C)."""
    base, _ = _store(experiment_id, root)
    if host not in ("127.0.0.1", "localhost", "::1"):
        console.print(f"[yellow]warning:[/] the dashboard listens on {host}: it has no login, anyone who "
                      "can reach that address can read and edit the study")
    _serve_until_interrupted(_start_dashboard(experiment_id, base, port, host, storage))


@app.command()
def stop(experiment_id: Annotated[str | None, typer.Argument()] = None,
         all_: Annotated[bool, typer.Option("--all", help="stop every running experiment")] = False,
         root: RootOpt = None,
         wait: Annotated[float, typer.Option(help="seconds to wait for the controller")] = 60.0) -> None:
    """Stop an experiment: running trials are cancelled (USER_CANCELED), status STOPPED."""
    if all_ == (experiment_id is not None):
        raise CliError("give an experiment id or --all")
    unreadable: list[str] = []
    ids = [experiment_id] if experiment_id else [e.id for e in list_experiments(root, unreadable)
                                                 if e.record.status in ("RUNNING", "INITIALIZED")]
    _report_unreadable(unreadable)
    for exp_id in ids:
        base, store = _store(exp_id, root)
        _stop_one(store, base, wait)
        console.print(f"experiment {exp_id} stopped")


def _stop_one(store: ExperimentStore, base: Path, wait: float) -> None:
    store.set_control("stop", True)
    deadline = time.monotonic() + wait
    while _controller_alive(store) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _controller_alive(store):
        os.kill(int(store.experiment().controller_pid), signal.SIGTERM)  # type: ignore[arg-type]
    # No controller (crashed or never resumed): cancel what it left behind ourselves.
    left = store.trials(["WAITING", "RUNNING"])
    for trial in left:
        store.set_status(trial.id, "USER_CANCELED", message="cancelled by trialflow stop")
    _cancel_offline(store, base, [t.handle for t in left])
    if store.experiment().status not in ("DONE", "ERROR"):
        end_experiment(store, "STOPPED")


def _open_service(store: ExperimentStore, base: Path) -> TrainingService:
    """The experiment's training service, for work done without its controller (kill, logs)."""
    config = load_experiment_config(store)
    return experiment_service(config, base / store.experiment_id)


def _cancel_offline(store: ExperimentStore, base: Path, handles: list[dict[str, Any] | None]) -> None:
    """Stop trials whose controller is gone, through their training service."""
    live = [TrialHandle.from_dict(h) for h in handles if h]
    if not live:
        return
    service = _open_service(store, base)
    try:
        for handle in live:
            try:
                service.cancel(handle, TrialStatus.USER_CANCELED)
            except PlatformError as exc:
                console.print(f"[yellow]warning:[/] trial {handle.trial_id} may still run: {exc}", highlight=False)
    finally:
        service.close()


_UPDATE_RULES = {"concurrency": ("trial_concurrency", 1, 1000), "trialnum": ("max_trial_number", 1, 999_999_999)}


def _update(experiment_id: str, what: str, value: str, root: Path | None) -> None:
    _, store = _store(experiment_id, root)
    if what == "duration":
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            raise CliError(f"bad duration value: {exc}") from None
        if not isinstance(seconds, int) or seconds <= 0:
            raise CliError(f"bad duration value {value!r}: must be positive, like '30m', '2h' or 3600")
        store.set_control("max_experiment_duration", seconds)
        console.print(f"maxExperimentDuration of {experiment_id} set to {seconds} s")
        return
    key, low, high = _UPDATE_RULES[what]
    try:
        number = int(value)
    except ValueError:
        raise CliError(f"bad {what} value {value!r}: must be an integer from {low} to {high}") from None
    if not low <= number <= high:
        raise CliError(f"bad {what} value {number}: must be from {low} to {high}")
    store.set_control(key, number)
    console.print(f"{what} of {experiment_id} set to {number}")


@update_app.command("concurrency")
def update_concurrency(experiment_id: str, value: str, root: RootOpt = None) -> None:
    """Set trialConcurrency (1-1000)."""
    _update(experiment_id, "concurrency", value, root)


@update_app.command("trialnum")
def update_trialnum(experiment_id: str, value: str, root: RootOpt = None) -> None:
    """Set maxTrialNumber."""
    _update(experiment_id, "trialnum", value, root)


@update_app.command("duration")
def update_duration(experiment_id: str, value: str, root: RootOpt = None) -> None:
    """Set maxExperimentDuration ('30m', '2h', seconds)."""
    _update(experiment_id, "duration", value, root)


# ---- experiments ----------------------------------------------------------------------------


@experiment_app.command("list")
def experiment_list(root: RootOpt = None) -> None:
    """Known experiments with their status."""
    from rich.table import Table

    table = Table("id", "name", "status", "trials", "started", "directory")
    unreadable: list[str] = []
    for e in list_experiments(root, unreadable):
        store = open_store(e.root, e.id)
        count = len(store.trials())
        store.close()
        started = time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(e.record.start_time or 0))
        table.add_row(e.id, e.record.name or "", e.record.status, str(count), started, str(e.root / e.id))
    console.print(table)
    _report_unreadable(unreadable)


def _report_unreadable(unreadable: list[str]) -> None:
    for line in unreadable:
        console.print(f"[yellow]skipped[/] {escape(line)}", highlight=False, soft_wrap=True)


@experiment_app.command("show")
def experiment_show(experiment_id: str, root: RootOpt = None) -> None:
    """The experiment's stored config and status as JSON."""
    _, store = _store(experiment_id, root)
    record = store.experiment()
    typer.echo(json.dumps({"id": record.id, "status": record.status, "message": record.message,
                           "config": record.config, "controls": record.controls}, indent=2))


@experiment_app.command("export")
def experiment_export(experiment_id: str,
                      filename: Annotated[Path, typer.Option("--filename", "-f", help="output file")],
                      kind: Annotated[str, typer.Option("--type", "-t", help="json or csv")] = "json",
                      intermediate: Annotated[bool, typer.Option("--intermediate", "-i")] = False,
                      root: RootOpt = None) -> None:
    """Export trials (parameters, final value, optionally intermediates) as JSON or CSV."""
    if kind not in ("json", "csv"):
        raise CliError(f"bad --type {kind!r}: use json or csv")
    _, store = _store(experiment_id, root)
    rows = export_rows(store, intermediate)
    if kind == "json":
        filename.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    else:
        from .views import write_csv

        write_csv(filename, rows)
    console.print(f"exported {len(rows)} trials to {filename}")


@experiment_app.command("import")
def experiment_import(experiment_id: str,
                      filename: Annotated[Path, typer.Option("--filename", "-f", help="JSON list of "
                                                             "{parameter, value}")],
                      root: RootOpt = None) -> None:
    """Import results ([{parameter, value}]) for the tuner, as NNI's importData: told to it on every (re)start;
    they are not trials (no budget, never the best trial). All items or none."""
    from .views import import_rows

    _, store = _store(experiment_id, root)
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
def experiment_optuna(experiment_id: str,
                      storage: Annotated[str, typer.Option("--storage", help="Optuna storage URL, e.g. "
                                                           "sqlite:///study.db")],
                      study: Annotated[str | None, typer.Option("--study", help="study name")] = None,
                      root: RootOpt = None) -> None:
    """Copy the experiment into an Optuna study (then: optuna-dashboard <storage>). Running it again
    brings the same study up to date."""
    from .dashboard import open_mirror

    _, store = _store(experiment_id, root)
    mirror = open_mirror(store, storage, study or f"trialflow-{experiment_id}")
    mirror.sync()
    console.print(f"study {mirror.study_name!r} with {mirror.trial_count} trials in {storage}; "
                  f"open it with: optuna-dashboard {storage}")


@experiment_app.command("report")
def experiment_report(experiment_id: str,
                      output: Annotated[Path, typer.Option("--output", "-o", help="the HTML file to write")],
                      root: RootOpt = None) -> None:
    """Write one self-contained HTML file with the experiment's charts (opens offline)."""
    from .report import write_report

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
def experiment_delete(experiment_id: str, root: RootOpt = None,
                      yes: Annotated[bool, typer.Option("--yes", "-y")] = False) -> None:
    """Delete a finished experiment's directory (trials, logs, store)."""
    base, store = _store(experiment_id, root)
    if _controller_alive(store):
        raise CliError(f"experiment {experiment_id} is running; stop it first")
    store.close()
    if not yes and not typer.confirm(f"delete {base / experiment_id}?"):
        raise typer.Exit(1)
    shutil.rmtree(base / experiment_id)
    console.print(f"deleted {experiment_id}")


# ---- trials ---------------------------------------------------------------------------------


@trial_app.command("ls")
def trial_ls(experiment_id: str, head: Annotated[int | None, typer.Option("--head")] = None,
             tail: Annotated[int | None, typer.Option("--tail")] = None, root: RootOpt = None) -> None:
    """Trials with status and final metric; --head/--tail N sort by metric (best/worst first)."""
    if head is not None and tail is not None:
        raise CliError("use either --head or --tail")
    _, store = _store(experiment_id, root)
    trials = store.trials()
    if head is not None or tail is not None:
        trials = sort_trials(trials, store, head, tail)
    print_trials(console, trials)


@trial_app.command("kill")
def trial_kill(experiment_id: str, trial_id: str, root: RootOpt = None) -> None:
    """Cancel one trial (USER_CANCELED)."""
    base, store = _store(experiment_id, root)
    try:
        trial = store.trial(trial_id)
    except KeyError as exc:
        raise CliError(str(exc).strip("'\"")) from None
    if trial.is_terminal:
        console.print(f"trial {trial_id} already ended ({trial.status})")
        return
    if _controller_alive(store):
        kills = store.experiment().controls.get("kill", [])
        store.set_control("kill", [*kills, trial_id])
    else:
        store.set_status(trial_id, "USER_CANCELED", message="cancelled by trialflow trial kill")
        _cancel_offline(store, base, [trial.handle])
    console.print(f"trial {trial_id} cancelled")


@log_app.command("trial")
def log_trial(experiment_id: str, trial_id: str, root: RootOpt = None,
              tail: Annotated[int | None, typer.Option("--tail", help="last N bytes of each log")] = None) -> None:
    """Print a trial's stdout, stderr and trial.log (fetched from the worker for remote trials)."""
    base, store = _store(experiment_id, root)
    try:
        trial = store.trial(trial_id)
    except KeyError as exc:
        raise CliError(str(exc).strip("'\"")) from None
    if not trial.handle:
        raise CliError(f"trial {trial_id} was never submitted, so it has no logs")
    handle = TrialHandle.from_dict(trial.handle)
    service = _open_service(store, base)
    try:
        logs = service.logs(handle, tail)
    except PlatformError as exc:
        raise CliError(f"cannot fetch the logs of trial {trial_id}: {exc}") from None
    finally:
        service.close()
    for name, text in logs.items():
        console.rule(name)
        typer.echo(text)


def _show_warning(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None,
                  line: str | None = None) -> None:
    """Config warnings as one line; others as Python prints them."""
    if issubclass(category, ConfigWarning):
        console.print(f"[yellow]warning:[/] {message}", highlight=False, soft_wrap=True)
    else:
        _default_show_warning(message, category, filename, lineno, file, line)


def main() -> None:
    """Console entry point: one-line errors, exit code 1."""
    warnings.showwarning = _show_warning
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_LOGGING_LEVEL", "CRITICAL")
    try:
        code = app(standalone_mode=False)
    except (CliError, StoreUnreadable) as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        sys.exit(1)
    except typer.Abort:
        sys.exit(1)
    except Exception as exc:
        if not (hasattr(exc, "show") and hasattr(exc, "exit_code")):
            raise
        exc.show()  # bad usage (click's exception, vendored by typer): its own message
        sys.exit(exc.exit_code)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
