"""The experiment-record audit: every broken invariant of a stored experiment, one line each.

The test suite runs it over every experiment a test leaves behind (``tests/conftest.py``), so a
record that is wrong in any run -- whatever the test looked at -- fails that test. Invariants:

* an experiment that ended (DONE, STOPPED, ERROR) has no trial WAITING or RUNNING, and no stop of
  ours left unsettled (the trial still marked ``stopping``);
* every ended trial has its end time; a trial that ran (it succeeded, exited with a code, or
  reported a metric) has its start time, no later than its end;
* a trial recorded as stopped by us (EARLY_STOPPED, USER_CANCELED) does not carry an exit code of its
  own choosing (0 to 127): that trial had exited by itself before the stop, and its own outcome stands;
* an EARLY_STOPPED trial's final result, if any, was recorded after the stop (a trial whose work was
  done is never stopped early: it keeps its outcome);
* SUCCEEDED means exit code 0 (or none reported) and, when the trial reported a final result, that
  result as the trial's final value;
* no more trials than the budget (``maxTrialNumber``, or a larger value set at run time);
* trial sequence numbers are unique and run 0, 1, 2, ... without a gap;
* the best trial recorded at the experiment's end is the best under the stored direction (none for a
  multi-objective experiment, whose Pareto set stands for it);
* the Pareto set recorded at a multi-objective experiment's end is exactly its SUCCEEDED trials whose
  results are feasible and not dominated under the stored objectives (none for a single-objective one);
* no metric stored after its trial's recorded end;
* a trial run again after n interruptions (attempt n) has n interruption events, starting attempts
  1..n in order, none after its end: no interrupted run's outcome became the trial's.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..experiments import STORE_URL_FILE, open_store
from ..experiments.results import exited_by_itself, expected_best, expected_pareto, maximizes
from ..foundation.status import EXPERIMENT_ENDED, TrialStatus
from ..platforms.base import attempt_of, stored_attempt
from ..records.store import (
    DB_RELATIVE_PATH,
    STOPPED_BY_US,
    TERMINAL,
    Control,
    ExperimentRecord,
    ExperimentStore,
    Metric,
    TrialRecord,
)
from ..records.store_engine import embedded_url, stored_experiment_ids

ENDED = EXPERIMENT_ENDED
CLOCK_SLACK = 0.001  # store times are floats written by one clock; allow rounding only


def check_experiment(path: str | os.PathLike[str]) -> list[str]:
    """The broken invariants of the experiment whose directory is ``path`` (empty when its record is
    sound). Raises what opening its store raises (``ExperimentNotFound`` for a folder without one)."""
    exp_dir = Path(path)
    store = open_store(exp_dir.parent, exp_dir.name)
    try:
        return check_store(store)
    finally:
        store.close()


def check_folder(path: str | os.PathLike[str]) -> tuple[int, list[str]]:
    """(how many experiments were audited, their broken invariants) for the folder ``path``: every
    experiment its embedded database holds (tests keep several in one), or the experiment of the shared
    store its ``db/store-url`` names."""
    folder = Path(path)
    if (folder / STORE_URL_FILE).is_file() and not (folder / DB_RELATIVE_PATH).is_file():
        return 1, check_experiment(folder)
    url = embedded_url(folder)
    ids = stored_experiment_ids(url)
    problems: list[str] = []
    for experiment_id in ids:
        store = ExperimentStore(url, experiment_id)
        try:
            problems += check_store(store)
        finally:
            store.close()
    return len(ids), problems


def has_records(path: str | os.PathLike[str]) -> bool:
    """Whether the folder ``path`` holds experiment records (an embedded store or a shared store's URL)."""
    return (Path(path) / DB_RELATIVE_PATH).is_file() or (Path(path) / STORE_URL_FILE).is_file()


def check_store(store: ExperimentStore) -> list[str]:
    """The broken invariants of the experiment in ``store``."""
    record = store.experiment()
    trials = store.trials()
    metrics = store.metrics()
    problems: list[str] = []
    for trial in trials:
        found = (_trial_problems(record, trial, metrics) + _stopped_after_its_work(store, trial, metrics)
                 + _interrupted_runs(store, trial))
        problems += [f"trial {trial.id} (#{trial.sequence}): {p}" for p in found]
    problems += _experiment_problems(record, trials)
    return [f"experiment {record.id}: {p}" for p in problems]


def _trial_problems(record: ExperimentRecord, trial: TrialRecord, metrics: list[Metric]) -> list[str]:
    own = [m for m in metrics if m.trial_id == trial.id]
    out = []
    if record.status in ENDED and not trial.is_terminal:
        out.append(f"{trial.status} in an experiment that is {record.status}")
    if record.status in ENDED and trial.stopping:
        out.append(f"{trial.status}, its stop never settled, in an experiment that is {record.status}")
    if trial.is_terminal and trial.end_time is None:
        out.append(f"{trial.status} without an end time")
    ran = trial.status == TrialStatus.SUCCEEDED or trial.exit_code is not None or bool(own)
    if ran and trial.start_time is None:
        out.append(f"ran ({_why_ran(trial, own)}) but has no start time")
    if trial.start_time is not None and trial.end_time is not None and trial.start_time > trial.end_time + CLOCK_SLACK:
        out.append("starts after it ends")
    if trial.status in STOPPED_BY_US and exited_by_itself(trial.exit_code):
        out.append(f"{trial.status} though it exited by itself with code {trial.exit_code}")
    if trial.status == TrialStatus.SUCCEEDED and trial.exit_code not in (0, None):
        out.append(f"SUCCEEDED with exit code {trial.exit_code}")
    finals = [m for m in own if m.type == "FINAL"]
    if trial.status == TrialStatus.SUCCEEDED and finals and trial.final is None:
        out.append("SUCCEEDED without the final result it reported")
    if trial.end_time is not None:
        late = [m for m in own if m.time > trial.end_time + CLOCK_SLACK]
        if late:
            out.append(f"{len(late)} metric(s) stored after its end (first: {late[0].type} #{late[0].sequence})")
    return out


def _stopped_after_its_work(store: ExperimentStore, trial: TrialRecord, metrics: list[Metric]) -> list[str]:
    if trial.status != TrialStatus.EARLY_STOPPED:
        return []
    finals = [m.time for m in metrics if m.trial_id == trial.id and m.type == "FINAL"]
    stops = [when for status, when, _ in store.status_history(trial.id) if status == TrialStatus.EARLY_STOPPED]
    if finals and stops and min(finals) < min(stops):
        return [f"EARLY_STOPPED though its final result was recorded {min(stops) - min(finals):.3f} s before the stop"]
    return []


def _interrupted_runs(store: ExperimentStore, trial: TrialRecord) -> list[str]:
    """A trial run n times after interruptions has n interruption events, in order, none after its end
    (an interrupted run's outcome is never the trial's)."""
    attempt = stored_attempt(trial.handle)
    if not attempt:
        return []
    events = [(attempt_of(message), when) for _, when, message in store.status_history(trial.id)]
    runs = [(n, when) for n, when in events if n is not None]
    out = []
    if [n for n, _ in runs] != list(range(1, attempt + 1)):
        out.append(f"attempt {attempt} but its interruption events start attempts {[n for n, _ in runs]}")
    if trial.end_time is not None and any(when > trial.end_time + CLOCK_SLACK for _, when in runs):
        out.append("an interruption recorded after its end")
    return out


def _why_ran(trial: TrialRecord, own: list[Metric]) -> str:
    if trial.status == TrialStatus.SUCCEEDED:
        return TrialStatus.SUCCEEDED
    if trial.exit_code is not None:
        return f"exit code {trial.exit_code}"
    return f"{len(own)} metric(s)"


def _experiment_problems(record: ExperimentRecord, trials: list[TrialRecord]) -> list[str]:
    out = []
    budgets = [b for b in (record.config.get("maxTrialNumber"), record.controls.get(Control.MAX_TRIAL_NUMBER)) if b]
    if budgets and len(trials) > max(budgets):
        out.append(f"{len(trials)} trials for a budget of {max(budgets)}")
    sequences = sorted(t.sequence for t in trials)
    if sequences != list(range(len(trials))):
        duplicates = sorted({s for s in sequences if sequences.count(s) > 1})
        missing = sorted(set(range(len(trials))) - set(sequences))
        out.append(f"trial sequences are not 0..{len(trials) - 1}: duplicated {duplicates[:5]}, "
                   f"missing {missing[:5]}")
    if record.status in ENDED and all(t.status in TERMINAL for t in trials):
        expected = expected_best(record, trials)
        if record.best_trial != expected:
            out.append(f"recorded best trial {record.best_trial} but the best under "
                       f"{'maximize' if maximizes(record) else 'minimize'} is {expected}")
        front = expected_pareto(record, trials)
        if record.pareto != front:
            out.append(f"recorded Pareto set {record.pareto} but the non-dominated feasible trials are {front}")
    return out
