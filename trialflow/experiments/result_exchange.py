"""Export and import of an experiment's results in nnictl's shapes, for the CLI and the Python API.

Export: a JSON row ``{parameter, value, trialJobId, status}`` per trial, early-stopped and failed
ones included (``value`` null without a final result; plus ``trainingService`` on hybrid experiments
and ``intermediate`` on request; ``pareto``, whether the trial is in the Pareto set, on multi-objective
ones). As nnictl's, ``value`` and each intermediate result are the result as its JSON text (``"0.93"``,
``"{\"default\": 0.93, ...}"``). CSV columns are the parameters, then ``reward`` or the dict metric's keys
(every objective and constraint), then ``trialJobId``, ``status``, ``pareto`` and, on request,
``intermediate`` (nnictl's ``[0.9,0.93]``). Import: NNI's importData, ``[{parameter, value}]``,
told to the tuner on every (re)start and never counted as trials; an exported row of a trial that
ended without a result is passed over. Import is all or nothing."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..foundation.user_errors import UserError
from ..platforms import service_name
from ..records.store_reader import RecordSource
from ..records.store_records import ImportedItem
from ..tuners.objectives import read_result
from . import stored_config
from .results import multi_objective, pareto_set

if TYPE_CHECKING:  # the config models load only to import results: an export needs none of them
    from ..config import ExperimentConfig
    from ..records.store import ExperimentStore


def export_rows(store: RecordSource, intermediate: bool) -> list[dict[str, Any]]:
    rows = []
    per_trial: dict[str, list[Any]] = {}
    if intermediate:
        for m in store.metrics(type="PERIODICAL"):
            per_trial.setdefault(m.trial_id, []).append(json.dumps(m.value))
    trials = store.trials()
    objectives = multi_objective(store.experiment())
    front = None if objectives is None else {t.id for t in pareto_set(trials, objectives)}
    for t in trials:
        row: dict[str, Any] = {"parameter": t.parameters, "value": None if t.final is None else json.dumps(t.final),
                               "trialJobId": t.id, "status": t.status}
        if front is not None:
            row["pareto"] = t.id in front
        if service_name(t.handle):
            row["trainingService"] = service_name(t.handle)
        if intermediate:
            row["intermediate"] = per_trial.get(t.id, [])
        rows.append(row)
    return rows


def export_results(store: RecordSource, path: Path, kind: str, intermediate: bool = False) -> int:
    """Write the experiment's results to ``path`` as ``kind`` (``json`` or ``csv``); returns how many
    trials were written. Raises ``OSError`` when the file cannot be written."""
    rows = export_rows(store, intermediate)
    if kind == "json":
        path.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    else:
        write_csv(path, rows)
    return len(rows)


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    flat = []
    for row in rows:
        value = json.loads(row["value"]) if row["value"] is not None else None
        # a trial without a result adds no column: with several objectives there is no "reward" one
        metric = value if isinstance(value, dict) else {} if value is None else {"reward": value}
        flat.append({**{k: json.dumps(v) if isinstance(v, dict) else v for k, v in row["parameter"].items()},
                     **metric, "trialJobId": row["trialJobId"], "status": row["status"],
                     **({"pareto": row["pareto"]} if "pareto" in row else {}),
                     **({"intermediate": "[" + ",".join(row["intermediate"]) + "]"} if "intermediate" in row else {})})
    columns: list[str] = []
    for r in flat:
        columns.extend(k for k in r if k not in columns)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(flat)


MAX_RESULTS_FILE_BYTES = 64 * 1024 * 1024  # a results file (an import, a warm start) is read whole


class ImportFileError(UserError, ValueError):
    """An import file that cannot be imported: missing, too large, not JSON, or an item that is not a
    result of the experiment (the message names the file or the item and its field)."""


def read_results_file(path: Path, role: str) -> Any:
    """The JSON a results file holds (NNI's importData, or ``experiment export --type json``), read whole
    when it has at most :data:`MAX_RESULTS_FILE_BYTES`. Raises ``FileNotFoundError``, and ``ValueError``
    with one line naming the file as ``role`` (e.g. "an import file") when it is larger, not UTF-8, not
    JSON, or nested too deeply to read."""
    size = path.stat().st_size
    if size > MAX_RESULTS_FILE_BYTES:
        raise ValueError(f"{path} is {size} bytes; {role} may hold at most {MAX_RESULTS_FILE_BYTES}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:
        raise ValueError(f"{path} is not valid JSON: nested too deeply") from None
    except ValueError as exc:  # a file not in UTF-8 too
        raise ValueError(f"{path} is not valid JSON: {exc}") from None


def import_file(store: ExperimentStore, path: Path) -> int:
    """Import the JSON file ``path`` (``[{parameter, value}]``, :func:`read_results_file`) as
    :func:`import_rows` does; returns the number of results imported. All items or none. Raises
    :class:`ImportFileError`."""
    try:
        return import_rows(store, read_results_file(path, "an import file"))
    except FileNotFoundError:
        raise ImportFileError(f"file {path} does not exist") from None
    except ValueError as exc:
        raise ImportFileError(str(exc)) from None


def import_rows(store: ExperimentStore, data: Any) -> int:
    """Import ``[{parameter, value}]`` as NNI's importData: told to the tuner on every (re)start, never
    trials of the experiment (no budget, not a best trial). All items or none: the first bad one is a
    ``ValueError`` naming it and the field."""
    return store.add_imported(import_items(stored_config(store), data))


def import_items(config: ExperimentConfig, data: Any) -> list[ImportedItem]:
    """``[{parameter, value}]`` (NNI's importData, or exported rows) as ``(parameters, raw values, value)``
    items for an experiment of ``config``; rows of trials that ended without a result are passed over.
    Raises ``ValueError`` naming the first bad item and its field."""
    if not isinstance(data, list):
        raise ValueError("the import file must hold a JSON list of {\"parameter\": {...}, \"value\": ...}")
    items = []
    objectives = config.multi_objective
    for i, item in enumerate(data):
        if not isinstance(item, dict) or "parameter" not in item or "value" not in item:
            raise ValueError(f"item {i}: expected an object with 'parameter' and 'value'")
        if item["value"] is None and item.get("status") not in (None, "SUCCEEDED"):
            continue  # an exported trial that ended without a result: nothing to tell the tuner
        if not isinstance(item["parameter"], dict):
            raise ValueError(f"item {i}: 'parameter' must be an object of parameter values")
        try:
            raw = config.raw_values(item["parameter"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"item {i}: 'parameter' does not fit the search space: {exc}") from None
        try:
            value = json.loads(item["value"]) if isinstance(item["value"], str) else item["value"]
            read_result(value, objectives)
        except (ValueError, RecursionError) as exc:
            wanted = "a finite number or a dict with a numeric 'default'" if objectives is None else \
                f"a dict with the objectives {', '.join(objectives.names)}"
            raise ValueError(f"item {i}: 'value' must be {wanted} ({exc})") from None
        items.append((item["parameter"], raw, value))
    return items
