"""Rendering and data exchange for the CLI: experiment summary, trial tables, export and import
(nnictl's shapes: export JSON rows ``{parameter, value, trialJobId}``, CSV columns = parameters +
``reward`` or the dict metric's keys + ``trialJobId``)."""

from __future__ import annotations

import csv
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .experiments import list_experiments, open_store, stored_config
from .platforms import service_name
from .results import best_trial, maximizes, ranked, trial_value
from .status import EXPERIMENT_LIVE, TrialStatus
from .store import ExperimentStore, TrialRecord
from .tuners import extract_scalar


def is_maximize_stored(store: ExperimentStore) -> bool:
    return maximizes(store.experiment())


def _when(ts: float | None) -> str:
    return time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(ts)) if ts else ""


def print_experiment(console: Console, store: ExperimentStore) -> None:
    record = store.experiment()
    trials = store.trials()
    counts: dict[str, int] = {}
    for t in trials:
        counts[t.status] = counts.get(t.status, 0) + 1
    cfg = record.config
    budget = record.controls.get("max_trial_number", cfg.get("maxTrialNumber"))
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
    if best is not None:
        console.print(f"best trial: {best.id} (#{best.sequence}) value {trial_value(best)} "
                      f"parameters {json.dumps(best.parameters)}")


RICH_TABLE_ROWS = 500  # above this, rich's cell measuring takes seconds (10,000 rows: ~10 s)
TRIAL_COLUMNS = ("trial", "#", "status", "final", "start", "end", "parameters")


def print_trials(console: Console, trials: list[TrialRecord]) -> None:
    """The trials as a table: a rich table up to ``RICH_TABLE_ROWS``, plain aligned columns beyond.
    A hybrid experiment's table names the service each trial ran on."""
    hybrid = any(service_name(t.handle) for t in trials)
    columns = (*TRIAL_COLUMNS[:3], "service", *TRIAL_COLUMNS[3:]) if hybrid else TRIAL_COLUMNS
    rows = [(t.id, str(t.sequence), t.status, *([service_name(t.handle) or ""] if hybrid else []),
             "" if t.final is None else json.dumps(t.final), _when(t.start_time), _when(t.end_time),
             json.dumps(t.parameters)) for t in trials]
    if len(rows) <= RICH_TABLE_ROWS:
        table = Table(*columns)
        for row in rows:
            table.add_row(*row)
        console.print(table)
        return
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(columns[:-1])]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[-1]
             for row in [columns, *rows]]
    console.file.write("\n".join(lines) + "\n")


def sort_trials(trials: list[TrialRecord], store: ExperimentStore, head: int | None, tail: int | None
                ) -> list[TrialRecord]:
    """Trials with a usable final value, best first (--head N) or worst first (--tail N)."""
    scored = ranked(trials, is_maximize_stored(store))
    return scored[:head] if head is not None else list(reversed(scored))[: tail or 0]


def export_rows(store: ExperimentStore, intermediate: bool) -> list[dict[str, Any]]:
    rows = []
    per_trial: dict[str, list[Any]] = {}
    if intermediate:
        for m in store.metrics(type="PERIODICAL"):
            per_trial.setdefault(m.trial_id, []).append(m.value)
    for t in store.trials():
        if t.final is None:
            continue
        row: dict[str, Any] = {"parameter": t.parameters, "value": json.dumps(t.final), "trialJobId": t.id}
        if service_name(t.handle):
            row["trainingService"] = service_name(t.handle)
        if intermediate:
            row["intermediate"] = per_trial.get(t.id, [])
        rows.append(row)
    return rows


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    flat = []
    for row in rows:
        value = json.loads(row["value"])
        metric = value if isinstance(value, dict) else {"reward": value}
        flat.append({**{k: json.dumps(v) if isinstance(v, dict) else v for k, v in row["parameter"].items()},
                     **metric, "trialJobId": row["trialJobId"],
                     **({"intermediate": json.dumps(row["intermediate"])} if "intermediate" in row else {})})
    columns: list[str] = []
    for r in flat:
        columns.extend(k for k in r if k not in columns)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(flat)


def import_rows(store: ExperimentStore, data: Any) -> int:
    """Import ``[{parameter, value}]`` as NNI's importData: told to the tuner on every (re)start, never
    trials of the experiment (no budget, not a best trial). All items or none: the first bad one is a
    ``ValueError`` naming it and the field."""
    if not isinstance(data, list):
        raise ValueError("the import file must hold a JSON list of {\"parameter\": {...}, \"value\": ...}")
    config = stored_config(store)
    items = []
    for i, item in enumerate(data):
        if not isinstance(item, dict) or "parameter" not in item or "value" not in item:
            raise ValueError(f"item {i}: expected an object with 'parameter' and 'value'")
        if not isinstance(item["parameter"], dict):
            raise ValueError(f"item {i}: 'parameter' must be an object of parameter values")
        try:
            raw = config.raw_values(item["parameter"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"item {i}: 'parameter' does not fit the search space: {exc}") from None
        try:
            value = json.loads(item["value"]) if isinstance(item["value"], str) else item["value"]
            extract_scalar(value)
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"item {i}: 'value' must be a finite number or a dict with a numeric 'default' "
                             f"({exc})") from None
        items.append((item["parameter"], raw, value))
    return store.add_imported(items)


def running_table(root: Path | None = None) -> Table:
    """The running experiments with their trial counts by status (``trialflow top``)."""
    table = Table("id", "name", "status", "trials", "running", "succeeded", "failed", "best",
                  title=time.strftime("running experiments at %H:%M:%S"))
    for entry in list_experiments(root):
        if entry.record.status not in EXPERIMENT_LIVE:
            continue
        store = open_store(entry.root, entry.id)
        try:
            trials = store.trials()
            best = best_trial(trials, maximizes(store.experiment()))
        finally:
            store.close()
        count = Counter(t.status for t in trials)
        table.add_row(entry.id, entry.record.name or "", entry.record.status, str(len(trials)),
                      str(count[TrialStatus.RUNNING] + count[TrialStatus.WAITING]), str(count[TrialStatus.SUCCEEDED]),
                      str(count[TrialStatus.FAILED]),
                      "-" if best is None else f"{trial_value(best)} ({best.id})")
    return table
