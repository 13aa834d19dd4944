"""The ``trial`` group (ls, kill) and ``log`` (a trial's logs; the controller's log and output)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ..app.controller_launch import CONTROLLER_OUTPUT
from ..foundation.ids import looks_like_experiment_id
from .common import (
    CliError,
    ExpIdArg,
    RootOpt,
    TrialIdOpt,
    _control,
    _experiments,
    _platforms,
    _results,
    _views,
    console,
    find_records,
    find_store,
    print_warnings,
)

trial_app = typer.Typer(help="List and kill trials.", no_args_is_help=True)
log_app = typer.Typer(help="Show trial logs.", no_args_is_help=True)


@trial_app.command("ls")
def trial_ls(experiment_id: ExpIdArg = None,
             head: Annotated[int | None, typer.Option("--head", min=1, help="the N best trials")] = None,
             tail: Annotated[int | None, typer.Option("--tail", min=1, help="the N worst trials")] = None,
             root: RootOpt = None,
             as_json: Annotated[bool, typer.Option("--json", help="nnictl's output: the trial jobs as JSON, as NNI's "
                                                   "REST API gives them")] = False) -> None:
    """Trials with status and final metric; --head/--tail N sort by metric (best/worst first); --json
    prints them as nnictl trial ls does."""
    if head is not None and tail is not None:
        raise CliError("use either --head or --tail")
    _, store = find_records(experiment_id, root)
    trials = store.trials()
    if head is not None or tail is not None:
        trials = _views.sort_trials(trials, store, head, tail)
    if as_json:
        from ..experiments.trial_jobs import nnictl_dates, trial_jobs

        jobs = trial_jobs(trials, store.metrics(type="FINAL"))
        typer.echo(json.dumps([nnictl_dates(job) for job in jobs], indent=4, sort_keys=True, separators=(",", ":")))
        return
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
    base, store = find_store(experiment_id, root)
    try:
        ended, warnings = _control.kill_trial(store, base, trial_id)
    except KeyError as exc:
        raise CliError(str(exc).strip("'\"")) from None
    print_warnings(warnings)
    if ended is not None:
        console.print(f"trial {trial_id} already ended ({ended})")
        return
    console.print(f"trial {trial_id} cancelled")


@log_app.command("trial")
def log_trial(experiment_id: ExpIdArg = None,
              trial_arg: Annotated[str | None, typer.Argument(metavar="[TRIAL]", show_default=False)] = None,
              trial_id: TrialIdOpt = None, root: RootOpt = None,
              tail: Annotated[int | None, typer.Option("--tail", min=1, help="last N bytes of each log")] = None
              ) -> None:
    """Print a trial's stdout, stderr and trial.log (fetched from the worker for remote trials); without
    a trial, as nnictl, each trial's id, status and log folder."""
    if trial_arg is None and trial_id is None and (experiment_id is None or looks_like_experiment_id(experiment_id)):
        _, store = find_store(experiment_id, root)
        for trial in store.trials():
            typer.echo(f"{trial.id}  {trial.status:<13}  {trial.log_dir or '(not submitted: no logs)'}")
        return
    experiment_id, trial_id = _ids(experiment_id, trial_arg, trial_id)
    base, store = find_store(experiment_id, root)
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


# every count is 1 or more: Python's slices read 0 as "all" and -N as "all but N"
HeadOpt = Annotated[int | None, typer.Option("--head", "-H", min=1, help="the first N lines")]
TailOpt = Annotated[int | None, typer.Option("--tail", "-T", min=1, help="the last N lines")]
PathOpt = Annotated[bool, typer.Option("--path", help="print the file's path only")]


def _log_file(experiment_id: str | None, root: Path | None, name: str) -> Path:
    base, store = find_store(experiment_id, root)
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


@log_app.command("stdout")
def log_stdout(experiment_id: ExpIdArg = None, head: HeadOpt = None, tail: TailOpt = None, path: PathOpt = False,
               root: RootOpt = None) -> None:
    """The experiment controller's log (log/experiment.log: the run's and its trials' records)."""
    _print_log(_log_file(experiment_id, root, Path(_experiments.CONTROLLER_LOG).name), head, tail, path)


@log_app.command("stderr")
def log_stderr(experiment_id: ExpIdArg = None, head: HeadOpt = None, tail: TailOpt = None, path: PathOpt = False,
               root: RootOpt = None) -> None:
    """What a background controller printed besides its log (log/controller.out: tracebacks, warnings).
    An experiment only ever run in the foreground has none: its controller printed where it ran."""
    output = _log_file(experiment_id, root, CONTROLLER_OUTPUT)
    if not path and not output.is_file():
        experiment = output.parent.parent.name
        console.print(f"experiment {experiment} has run in the foreground only (a terminal, notebook or script), "
                      f"where its controller printed; its log: trialflow log stdout {experiment}", highlight=False,
                      soft_wrap=True)
        return
    _print_log(output, head, tail, path)
