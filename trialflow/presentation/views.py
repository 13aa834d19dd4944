"""Rendering for the CLI: experiment summary, trial tables, the running experiments (export and
import are :mod:`trialflow.experiments.result_exchange`)."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console, Group
from rich.markup import escape
from rich.table import Table

from ..experiments import list_experiments, open_store
from ..experiments.results import (
    best_trial,
    maximizes,
    multi_objective,
    multi_results,
    pareto_lines,
    pareto_set,
    ranked,
    trial_value,
)
from ..experiments.trial_jobs import nnictl_time
from ..foundation.status import EXPERIMENT_LIVE, TrialStatus
from ..platforms import service_name
from ..platforms.base import stored_attempt
from ..records.store_reader import RecordSource
from ..records.store_records import TrialRecord, config_in_force
from ..tuners.objectives import Objectives

if TYPE_CHECKING:  # the store's module loads SQLAlchemy, which the read-only commands do without
    from ..records.store import ExperimentStore


def is_maximize_stored(store: RecordSource) -> bool:
    return maximizes(store.experiment())


def _when(ts: float | None) -> str:
    return nnictl_time(ts) if ts else ""


def print_experiment(console: Console, store: RecordSource) -> None:
    record = store.experiment()
    trials = store.trials()
    counts: dict[str, int] = {}
    for t in trials:
        counts[t.status] = counts.get(t.status, 0) + 1
    budget = config_in_force(record)[0].get("maxTrialNumber")
    console.print(f"[bold]{record.id}[/] {escape(record.name or '')}  status: [bold]{record.status}[/]"
                  + (f"  ({escape(record.message)})" if record.message else ""), markup=True)
    console.print(f"trials: {len(trials)}" + (f" / {budget}" if budget else "") + "  "
                  + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    per_service: dict[str, dict[str, int]] = {}
    for t in trials:
        name = service_name(t.handle)
        if name is not None:
            per_service.setdefault(name, {}).setdefault(t.status, 0)
            per_service[name][t.status] += 1
    for name, by_status in sorted(per_service.items()):  # hybrid experiments: where the trials ran
        console.print(f"  on {name}: {sum(by_status.values())}  "
                      + ", ".join(f"{k} {v}" for k, v in sorted(by_status.items())), highlight=False)
    best = best_trial(trials, is_maximize_stored(store))
    front = pareto_lines(store.experiment(), trials)
    if front is not None:
        console.print("\n".join(front), highlight=False, markup=False)
    elif best is not None:
        console.print(f"best trial: {best.id} (#{best.sequence}) value {trial_value(best)} "
                      f"parameters {json.dumps(best.parameters)}")


RICH_TABLE_ROWS = 500  # above this, rich's cell measuring takes seconds (it grows with the rows)
TRIAL_COLUMNS = ("trial", "#", "status", "metric", "duration", "parameters or reason")


def _duration(trial: TrialRecord) -> str:
    if trial.start_time is None:
        return ""
    seconds = max((trial.end_time or time.time()) - trial.start_time, 0.0)
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes}m{seconds:02d}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


def _metric(trial: TrialRecord) -> tuple[str]:
    value = trial_value(trial)
    return ("" if value is None else f"{value:.6g}",)


def _objective_cells(trial: TrialRecord, objectives: Objectives, in_front: bool) -> tuple[str, ...]:
    result = objectives.read_or_none(trial.final)
    values = ["" for _ in objectives.names] if result is None else [f"{v:.6g}" for v in result.values]
    return (*values, "*" if in_front else "")


def _detail(trial: TrialRecord) -> str:
    """Why a trial that did not succeed ended, else its parameters as ``name=value``."""
    if trial.message and trial.status not in (TrialStatus.SUCCEEDED, TrialStatus.RUNNING, TrialStatus.WAITING):
        return trial.message
    return ", ".join(f"{k}={_compact(v)}" for k, v in trial.parameters.items())


def _compact(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return json.dumps(value) if isinstance(value, dict | list | str) else str(value)


def print_trials(console: Console, trials: list[TrialRecord], objectives: Objectives | None = None) -> None:
    """The trials, one line each (id, status, metric, duration, then the parameters or the reason it
    ended, cut to the terminal's width): a rich table up to ``RICH_TABLE_ROWS``, plain aligned
    columns beyond. A hybrid experiment's table names the service each trial ran on; a multi-objective
    one's has a column per objective instead of the metric, and ``*`` in ``pareto`` for its Pareto set.
    Once any trial was run again after an interruption, ``runs`` says how many runs each had. An
    experiment with none yet (its first is still being submitted) gets a line saying so."""
    if not trials:
        console.print("no trials yet")
        return
    hybrid = any(service_name(t.handle) for t in trials)
    runs = [1 + stored_attempt(t.handle) for t in trials]
    rerun = any(n > 1 for n in runs)
    metric_columns: tuple[str, ...] = ("metric",) if objectives is None else (*objectives.names, "pareto")
    columns = (*TRIAL_COLUMNS[:3], *(["service"] if hybrid else []), *(["runs"] if rerun else []), *metric_columns,
               *TRIAL_COLUMNS[4:])
    front = set() if objectives is None else {t.id for t in pareto_set(trials, objectives)}
    rows = [(t.id, str(t.sequence), t.status, *([service_name(t.handle) or ""] if hybrid else []),
             *([str(n)] if rerun else []),
             *(_metric(t) if objectives is None else _objective_cells(t, objectives, t.id in front)),
             _duration(t), _detail(t)) for t, n in zip(trials, runs, strict=True)]
    if len(rows) <= RICH_TABLE_ROWS:
        table = Table(box=box.SIMPLE_HEAD)
        widths = [max(len(name), *(len(r[i]) for r in rows)) for i, name in enumerate(columns[:-1])]
        for name, width in zip(columns, widths, strict=False):  # whole, always: only the last column is cut
            table.add_column(name, no_wrap=True, min_width=width)
        room = max(console.width - sum(widths) - 2 * len(columns) - 5, len(columns[-1]))  # less padding, edges
        table.add_column(columns[-1], no_wrap=True, max_width=room)
        for row in rows:
            last = row[-1] if len(row[-1]) <= room else row[-1][:room - 1] + "…"
            table.add_row(*(escape(cell) for cell in (*row[:-1], last)))
        console.print(table)
        return
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(columns[:-1])]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[-1]
             for row in [columns, *rows]]
    console.file.write("\n".join(lines) + "\n")


def sort_trials(trials: list[TrialRecord], store: RecordSource, head: int | None, tail: int | None
                ) -> list[TrialRecord]:
    """Trials with a usable final value, best first (--head N) or worst first (--tail N); several
    objectives' results in :meth:`Objectives.ranked` order."""
    objectives = multi_objective(store.experiment())
    if objectives is None:
        scored = ranked(trials, is_maximize_stored(store))
    else:
        by_id = {t.id: t for t in trials}
        scored = [by_id[i] for i in objectives.ranked(multi_results(trials, objectives))]
    return scored[:head] if head is not None else list(reversed(scored))[: tail or 0]


class RunningView:
    """What ``trialflow top`` shows, from stores kept open between refreshes: each :meth:`table` lists the
    experiments, and of each running one reads only the trials that changed since its last refresh
    (:class:`~trialflow.records.changed_trials.ChangedTrials`) and the latest intermediate result of its
    live trials, so a refresh costs the same at 10 trials and at 10,000.

    Lifecycle: one per ``top``; an experiment's store is opened when it is first seen running and closed
    when it no longer is, or at :meth:`close`. One thread at a time."""

    def __init__(self, root: Path | None = None, slack: float | None = None) -> None:
        from ..records.changed_trials import OTHER_CLOCK_SLACK  # another machine's controller may write the store

        self.root, self.slack = root, OTHER_CLOCK_SLACK if slack is None else slack
        self._followed: dict[tuple[Path, str], _Followed] = {}

    def table(self) -> Group:
        """The running experiments with their trial counts by status, then their live trials (how long
        each has run, its latest intermediate result)."""
        table = Table("id", "name", "status", "trials", "running", "succeeded", "failed", "best",
                      title=time.strftime("running experiments at %H:%M:%S"))
        live = Table("experiment", "trial", "#", "status", "running for", "latest result", title="their live trials")
        seen = set()
        for entry in list_experiments(self.root):
            if entry.record.status not in EXPERIMENT_LIVE:
                continue
            key = (entry.root, entry.id)
            seen.add(key)
            followed = self._followed.get(key)
            if followed is None:
                followed = self._followed[key] = _Followed(open_store(entry.root, entry.id), self.slack)
            trials = followed.kept.read()
            active = [t for t in trials if t.status in (TrialStatus.RUNNING, TrialStatus.WAITING)]
            latest = followed.store.latest_metrics((t.id for t in active), "PERIODICAL")
            for t in active:
                result = latest.get(t.id)
                live.add_row(entry.id, t.id, str(t.sequence), t.status, _duration(t),
                             escape(json.dumps(result.value)) if result else "")
            count = Counter(t.status for t in trials)
            best = best_trial(trials, followed.maximize)
            table.add_row(entry.id, entry.record.name or "", entry.record.status, str(len(trials)), str(len(active)),
                          str(count[TrialStatus.SUCCEEDED]), str(count[TrialStatus.FAILED]),
                          "-" if best is None else f"{trial_value(best)} ({best.id})")
        for key in set(self._followed) - seen:
            self._followed.pop(key).store.close()
        return Group(table, live)

    def close(self) -> None:
        for followed in self._followed.values():
            followed.store.close()
        self._followed.clear()


class _Followed:
    """One running experiment of a :class:`RunningView`: its store and its trials as last read."""

    def __init__(self, store: ExperimentStore, slack: float) -> None:
        from ..records.changed_trials import KeptTrials

        self.store = store
        self.maximize = maximizes(store.experiment())
        self.kept = KeptTrials(store, slack)


def running_table(root: Path | None = None, view: RunningView | None = None) -> Group:
    """What ``trialflow top`` shows now: ``view``'s next refresh, or a one-off view's of ``root``."""
    if view is not None:
        return view.table()
    once = RunningView(root)
    try:
        return once.table()
    finally:
        once.close()
