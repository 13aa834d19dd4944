"""The ``experiment`` group (list, show, export, import, optuna, report, delete, status, save, load),
``update`` (a running experiment's concurrency, budget, duration and search space) and ``config``
(convert an NNI v1 file, show the config in force)."""

from __future__ import annotations

import json
import warnings
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..foundation.status import EXPERIMENT_LIVE, ExperimentStatus
from .common import (
    CliError,
    ExpIdArg,
    RootOpt,
    _config,
    _control,
    _experiments,
    _records,
    console,
    find_records,
    find_store,
    report_unreadable,
)

if TYPE_CHECKING:
    from ..records.store import ExperimentStore


experiment_app = typer.Typer(help="List, show, export, import and delete experiments.", no_args_is_help=True)


@experiment_app.command("list")
def experiment_list(root: RootOpt = None,
                    all_: Annotated[bool, typer.Option("--all", help="every experiment, not only running "
                                                       "ones")] = False) -> None:
    """Running experiments with their status, port and platform (as nnictl); --all: every known
    experiment. A table on a terminal; into a pipe or a file, nnictl's own lines (`Id: ...    Name: ...`,
    then the trial count and the folder), each value whole."""
    from rich.table import Column, Table

    from ..experiments.trial_jobs import NNICTL_LIST_FRAME, nnictl_list_line, nnictl_time

    # on a narrow terminal the other columns give way to the id, status and port, which stay whole
    table = Table(Column("id", no_wrap=True), "name", Column("status", no_wrap=True), Column("port", no_wrap=True),
                  "platform", "trials", "started", "directory")
    piped = not console.is_terminal  # a script reads what nnictl prints, nothing cut to the width
    lines: list[str] = []
    unreadable: list[str] = []
    for e in _experiments.list_experiments(root, unreadable):
        if not all_ and e.record.status not in EXPERIMENT_LIVE:
            continue
        store = _experiments.open_records(e.root, e.id)
        count = store.count_trials()
        store.close()
        port = _experiments.shown_port(e.record)
        platform = _experiments.platform_of(e.record)
        if piped:
            lines.append(nnictl_list_line(e.record, port, platform, count, e.root / e.id))
        else:
            table.add_row(e.id, e.record.name or "", e.record.status, "-" if port is None else str(port),
                          platform or "-", str(count), nnictl_time(e.record.start_time or 0), str(e.root / e.id))
    if lines:
        print(NNICTL_LIST_FRAME % "".join(lines))
    elif table.row_count:
        console.print(table)
    elif not all_:  # as nnictl says it, instead of an empty table
        console.print("no experiment is running: `trialflow experiment list --all` lists all", soft_wrap=True)
    elif not unreadable:  # otherwise the skipped ones are said below
        console.print("no experiment yet")
    report_unreadable(unreadable)


@experiment_app.command("show")
def experiment_show(experiment_id: ExpIdArg = None, root: RootOpt = None) -> None:
    """What nnictl experiment show prints, NNI's experiment profile as JSON (the config in force as
    `params`, `update` and `resume --trialnum/--duration` included; start, end, run time, folder), then
    the status, the history of those changes and where the tuner's imported results came from."""
    from ..experiments.trial_jobs import experiment_profile, nnictl_dates

    base, store = find_store(experiment_id, root)
    record = store.experiment()
    controls = _records.config_in_force(record)[1]
    history = [{"time": datetime.fromtimestamp(u.time, timezone.utc).isoformat(timespec="seconds"),
                "field": _records.CONTROLLED_FIELDS.get(u.control, u.control), "value": u.value, "via": u.via}
               for u in store.updates()]
    imported = [{"source": source or "experiment import", "results": count}
                for source, count in store.imported_sources().items()]
    typer.echo(json.dumps({**nnictl_dates(experiment_profile(record, str(base / record.id))),
                           "status": record.status, "message": record.message, "controls": controls,
                           "updates": history, "imported": imported},
                          indent=4, sort_keys=True, separators=(",", ":")))


@experiment_app.command("export")
def experiment_export(
                      filename: Annotated[Path, typer.Option("--filename", "-f", help="output file")],
                      kind: Annotated[str, typer.Option("--type", "-t", help="json or csv")] = "json",
                      intermediate: Annotated[bool, typer.Option("--intermediate", "-i")] = False,
                      experiment_id: ExpIdArg = None, root: RootOpt = None) -> None:
    """Export trials (parameters, final value, optionally intermediates) as JSON or CSV."""
    if kind not in ("json", "csv"):
        raise CliError(f"bad --type {kind!r}: use json or csv")
    _, store = find_records(experiment_id, root)
    from ..experiments.result_exchange import export_results

    try:
        count = export_results(store, filename, kind, intermediate)
    except OSError as exc:
        raise CliError(f"cannot write {filename} ({exc.strerror}): give --filename a file in a folder that "
                       "exists and you can write to") from None
    console.print(f"exported {count} trials to {filename}")


@experiment_app.command("import")
def experiment_import(
                      filename: Annotated[Path, typer.Option("--filename", "-f", help="JSON list of "
                                                             "{parameter, value}")],
                      experiment_id: ExpIdArg = None, root: RootOpt = None) -> None:
    """Import results ([{parameter, value}]) for the tuner, as NNI's importData: told to it on every (re)start;
    they are not trials (no budget, never the best trial). All items or none."""
    from ..experiments.result_exchange import import_file

    _, store = find_store(experiment_id, root)
    count = import_file(store, filename)
    console.print(f"imported {count} result{'s' if count != 1 else ''} for the tuner of {store.experiment_id} "
                  "(not trials: they count toward no budget)")


@experiment_app.command("optuna")
def experiment_optuna(
                      storage: Annotated[str, typer.Option("--storage", help="Optuna storage URL, e.g. "
                                                           "sqlite:///study.db")],
                      study: Annotated[str | None, typer.Option("--study", help="study name")] = None,
                      experiment_id: ExpIdArg = None, root: RootOpt = None) -> None:
    """Copy the experiment into an Optuna study (then: optuna-dashboard <storage>). Running it again
    brings the same study up to date."""
    from ..presentation.dashboard import open_mirror

    _, store = find_store(experiment_id, root)
    mirror = open_mirror(store, storage, study or f"trialflow-{store.experiment_id}")
    mirror.sync()
    console.print(f"study {mirror.study_name!r} with {mirror.trial_count} trials in {storage}; "
                  f"open it with: optuna-dashboard {storage}")


@experiment_app.command("report")
def experiment_report(
                      output: Annotated[Path, typer.Option("--output", "-o", help="the HTML file to write")],
                      experiment_id: ExpIdArg = None, root: RootOpt = None) -> None:
    """Write one self-contained HTML file with the experiment's charts (opens offline)."""
    from ..presentation.report import write_report

    _, store = find_store(experiment_id, root)
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
        base, store = find_store(experiment_id, root)
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
    _, store = find_store(experiment_id, root)
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
    from ..app.experiment_archive import save_experiment

    base, store = find_store(experiment_id, root)
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
    from ..app.experiment_archive import ArchiveError, load_experiment
    from ..experiments import default_root

    try:
        experiment_id = load_experiment(path, code_dir, log_dir or default_root(), search_space)
    except (ArchiveError, OSError) as exc:
        raise CliError(str(exc)) from None
    console.print(f"loaded experiment {experiment_id}; view it: trialflow view {experiment_id}", highlight=False)


update_app = typer.Typer(help="Change a running experiment: concurrency, trialnum, duration.", no_args_is_help=True)
ValueArg = Annotated[str | None, typer.Argument(metavar="[VALUE]", help="the new value (or --value)",
                                               show_default=False)]
ValueOpt = Annotated[str | None, typer.Option("--value", "-v", help="the new value")]


def _when_applied(store: ExperimentStore) -> str:
    """When an update takes effect: now for a running experiment, else at its next run."""
    if _control.controller_alive(store):
        return ""
    return f"; it takes effect when the experiment runs again: trialflow resume {store.experiment_id}"


def _update(experiment_id: str | None, what: str, value: str, root: Path | None) -> None:
    base, store = find_store(experiment_id, root)
    lines = _control.run_on_budget(store, what, value)
    if lines is not None:  # it ended DONE: it runs on with the larger budget, as NNI's manager does
        from .running import launch

        for line in lines:
            console.print(line, highlight=False)
        launch(store.experiment_id, base, None, False, earlier_run=store.experiment().flow_run_id)
        return
    number = _control.update_experiment(store, what, value)
    if what == "duration":
        console.print(f"maxExperimentDuration of {store.experiment_id} set to {number} s{_when_applied(store)}")
    else:
        console.print(f"{what} of {store.experiment_id} set to {number}{_when_applied(store)}")


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
    """Set maxTrialNumber (a larger one runs a DONE experiment on, as NNI's manager does)."""
    _update(experiment_id, "trialnum", _value_of(value, value_opt), root)


@update_app.command("duration")
def update_duration(experiment_id: ExpIdArg = None, value: ValueArg = None, value_opt: ValueOpt = None,
                    root: RootOpt = None) -> None:
    """Set maxExperimentDuration ('30m', '2h', seconds; a longer one runs a DONE experiment on)."""
    _update(experiment_id, "duration", _value_of(value, value_opt), root)


@update_app.command("searchspace")
def update_searchspace(experiment_id: ExpIdArg = None,
                       filename: Annotated[Path, typer.Option("--filename", "-f", help="the new search space "
                                                              "(JSON)")] = Path("search_space.json"),
                       root: RootOpt = None) -> None:
    """Replace the search space of a running experiment: later trials take their parameters from it
    (the tuner is rebuilt and told the results so far that fit it); running trials keep theirs."""
    from ..records.search_space import SearchSpaceError

    _, store = find_store(experiment_id, root)
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


config_app = typer.Typer(help="Work with experiment config files.", no_args_is_help=True)


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


@config_app.command("show")
def config_show(experiment_id: ExpIdArg = None, root: RootOpt = None) -> None:
    """The experiment's config as YAML, with the values in force (`update` included; the password of
    a shared store left out)."""
    import yaml

    _, store = find_store(experiment_id, root)
    config, _ = _records.config_in_force(store.experiment())
    typer.echo(yaml.safe_dump(config, sort_keys=False, allow_unicode=True), nl=False)
