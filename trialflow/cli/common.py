"""What every command group of the command line shares: the console, the option types, the one-line
error (:class:`CliError`), finding an experiment's store by id (or the only running one), and the
trialflow modules the commands import on first use."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape

from ..foundation.lazy import lazy_module
from ..foundation.readable import wait_readable
from ..foundation.status import EXPERIMENT_LIVE
from ..foundation.user_errors import UserError

if TYPE_CHECKING:
    from ..records.store import ExperimentStore
    from ..records.store_reader import RecordSource

# imported on first use: `trialflow --help` and light commands never import Prefect, Optuna or SDKs
_config = lazy_module("trialflow.config")
_control = lazy_module("trialflow.app.control")
_records = lazy_module("trialflow.records.store_records")
_experiments = lazy_module("trialflow.experiments")
_warm = lazy_module("trialflow.experiments.warm_start")
_run_control = lazy_module("trialflow.flows.run_control")
_platforms = lazy_module("trialflow.platforms")
_results = lazy_module("trialflow.experiments.results")
_tuners = lazy_module("trialflow.tuners")
_views = lazy_module("trialflow.presentation.views")
console = Console(markup=False)  # printed values are never read as markup; styled lines say markup=True
RootOpt = Annotated[Path | None, typer.Option("--root", help="experiment working directory to search")]
ExpIdArg = Annotated[str | None, typer.Argument(metavar="[ID]", help="experiment id (default: the only running one)",
                                                show_default=False)]
TrialIdOpt = Annotated[str | None, typer.Option("--trial_id", "-T", help="the trial's id (or give it after the "
                                                "experiment id)")]
DashboardOpt = Annotated[bool, typer.Option("--dashboard", help="also serve a live optuna-dashboard of it "
                                            "(until Ctrl-C)")]
DashboardPortOpt = Annotated[int | None, typer.Option("--dashboard-port", min=0, max=65535, help="the dashboard's "
                                                      "port (default 8080; 0: any free one; with --dashboard)")]
UiPortOpt = Annotated[int | None, typer.Option("--port", "-p", min=1, max=65535, help="the port of the local Prefect "
                                               "server, whose UI is NNI's web UI here (kept for its later starts)")]
UrlPrefixOpt = Annotated[str | None, typer.Option("--url_prefix", "--url-prefix", "-u", help="the path the local "
                                                 "Prefect server serves its UI under (e.g. nni; kept for its "
                                                 "later starts; / for the root)")]
DebugOpt = Annotated[bool, typer.Option("--debug", "-d", help="log at debug level (the config's logLevel: debug)")]
ExperimentDirOpt = Annotated[Path | None, typer.Option("--experiment_dir", "-e", help="the experiment's folder "
                                                       "(its parent is the working directory to search)")]
DEFAULT_DASHBOARD_PORT = 8080
SERVER_ENV_LINE = 'eval "$(trialflow server env)"'


class CliError(UserError):
    """A user-facing failure: printed as one line, exit code 1."""


def find_store(experiment_id: str | None, root: Path | None) -> tuple[Path, ExperimentStore]:
    """The experiment's working directory and store; without an id, the only running experiment (as
    nnictl)."""
    return _experiments.find_experiment(_given_or_running(experiment_id, root), root)


def find_records(experiment_id: str | None, root: Path | None) -> tuple[Path, RecordSource]:
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


def print_warnings(warnings: list[str]) -> None:
    for warning in warnings:
        console.print(f"[yellow]warning:[/] {escape(warning)}", markup=True, highlight=False)


def report_unreadable(unreadable: list[str]) -> None:
    for line in unreadable:
        console.print(f"[yellow]skipped[/] {escape(line)}", markup=True, highlight=False, soft_wrap=True)


def root_of_experiment_dir(experiment_id: str, root: Path | None, experiment_dir: Path | None) -> Path | None:
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


class StopSignals:
    """Ctrl-C and SIGTERM for a command that waits until one comes (``top``, a served dashboard): from
    construction on each is noted, not raised, and :meth:`wait` returns as soon as one comes, also when
    this process was started with SIGINT ignored (a background job of a shell without job control
    passes that on). A handler that raised KeyboardInterrupt lost the signal when it landed while the
    interpreter ran a destructor or a weakref callback, which print such an exception and drop it: the
    command ran on. Construct it in the main thread (Python runs signal handlers there); it lasts for
    the rest of the process."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._wakeup, write = os.pipe()  # the interpreter writes a byte per signal: wait()'s select wakes
        os.set_blocking(self._wakeup, False)
        os.set_blocking(write, False)
        signal.set_wakeup_fd(write)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._note)

    def _note(self, signum: int, _frame: object) -> None:
        self.signum = signum

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``, less once a signal comes; whether one has come."""
        if self.signum is None:
            wait_readable([self._wakeup], seconds)
            try:
                os.read(self._wakeup, 4096)
            except BlockingIOError:
                pass
        return self.signum is not None


def use_kept_server(port: int | None = None, url_prefix: str | None = None) -> int | None:
    """Without a configured Prefect API, this process and the controllers it starts use the kept local
    server (started now when none runs, without waiting: it comes up while the controller imports);
    ``port`` and ``url_prefix`` (nnictl's ``--port`` and ``--url_prefix``): the port it starts on and
    the path it must serve its UI under. Returns the server's port, or None for another API. A server
    running on another port than ``port`` serves this experiment too (one server for all experiments):
    the caller gives the experiment ``port`` as its address (``hold_web_port``)."""
    from ..server.api_choice import point_this_process_at_kept_server, uses_kept_server, wants_temporary_server
    from ..server.kept_server import SERVER_SETTING, running_server

    chosen = [flag for flag, value in (("--port", port), ("--url_prefix", url_prefix)) if value is not None]
    if chosen and os.environ.get("PREFECT_API_URL"):
        raise CliError(f"{chosen[0]} is for the local Prefect server, but PREFECT_API_URL is set to "
                       f"{os.environ['PREFECT_API_URL']} (experiments report there): leave {chosen[0]} out, or "
                       "unset it")
    if port is not None and uses_kept_server() and (running := running_server()) is not None and running.port != port:
        port = None  # nnictl's one port per experiment: this one's address only
    server = point_this_process_at_kept_server(port=port, url_prefix=url_prefix)
    if server is None and chosen:
        why = (f"{SERVER_SETTING}={os.environ[SERVER_SETTING]} asks for Prefect's temporary server, which has no UI"
               if wants_temporary_server() else "your Prefect profiles set PREFECT_API_URL (`prefect config "
               "view` shows the active one)")
        raise CliError(f"{chosen[0]} is for trialflow's local Prefect server, but {why}: leave {chosen[0]} out")
    return None if server is None else server.port

