"""Warm start: a new experiment's tuner learns from earlier experiments (the config's ``warmStart``, or
``trialflow create --warm-start``). Each source is a stored experiment's id or a file that
``trialflow experiment export --type json`` wrote; their finished trials with a result become the new
experiment's imported data (NNI's ``importData``): told to its tuner on every (re)start, never trials
of it (no budget, never its best trial), each item marked with its source.

A stored experiment's search space must match the new one parameter by parameter (the same names and
the same ``_type``): a source that does not is refused in one line naming each parameter. A trial whose
values fall outside the new space's ranges or choices (a narrowed range) is left out and counted. A
file gives no space: each of its items is checked as ``experiment import`` checks it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import ExperimentConfig
from ..foundation.ids import looks_like_experiment_id
from ..foundation.user_errors import UserError
from ..records.store import ExperimentStore, ImportedItem, config_in_force
from . import ExperimentNotFound, check_new_experiment, create_experiment, find_experiment
from .result_exchange import export_rows, import_items, read_results_file


class WarmStartError(UserError, ValueError):
    """A warm-start source that cannot be used; one line naming it and what to change."""


@dataclass
class WarmStart:
    """What one source gives: ``items`` as ``(parameters, raw values, value)``, and how many of its
    results were ``left_out`` (outside the new search space)."""

    source: str
    items: list[ImportedItem]
    left_out: int

    def line(self) -> str:
        outside = f" ({self.left_out} outside this search space left out)" if self.left_out else ""
        return f"warm start: {len(self.items)} finished trials from {self.source}{outside}"


def create_warm_started(config: ExperimentConfig, config_path: str | None = None,
                        overridden: Iterable[str] = (), experiment_id: str | None = None,
                        notes: list[str] | None = None) -> tuple[str, Path]:
    """Create an experiment (:func:`~trialflow.experiments.create_experiment`) with what its
    ``warmStart`` sources give as imported data; a line per source saying what it gave is appended to
    ``notes``. The tuner, assessor and GPUs are checked before any source is read. Raises what
    :func:`~trialflow.experiments.check_new_experiment` raises, then :class:`WarmStartError`; a refusal
    leaves nothing."""
    starts: list[WarmStart] = []
    if config.warm_start:
        check_new_experiment(config)
        starts = gather(config, Path(config.experiment_working_directory).resolve())
    created = create_experiment(config, config_path, overridden, experiment_id,
                                imported=[(start.source, start.items) for start in starts])
    if notes is not None:
        notes.extend(start.line() for start in starts)
    return created


def gather(config: ExperimentConfig, root: Path) -> list[WarmStart]:
    """Read every source of ``config.warm_start`` (experiment ids are looked for under ``root`` first,
    then where experiments are known). Raises :class:`WarmStartError` naming the first source that
    cannot be used; nothing is written."""
    return [_gather_one(config, source, root) for source in config.warm_start or []]


def _gather_one(config: ExperimentConfig, source: str, root: Path) -> WarmStart:
    if looks_like_experiment_id(source) and not Path(source).is_file():
        rows, space = _experiment_rows(source, root)
        problems = space_differences(space, config.search_space)
        if problems:
            raise WarmStartError(f"warm start from experiment {source}: its search space does not match this one: "
                                 f"{'; '.join(problems)}; remove it from warmStart or align the spaces")
        items, left_out = _fitting(config, rows)
        return WarmStart(source, items, left_out)
    rows = _file_rows(Path(source))
    try:
        items = import_items(config, rows)
    except ValueError as exc:
        raise WarmStartError(f"warm start from {source}: {exc}") from None
    return WarmStart(source, items, 0)


def _experiment_rows(experiment_id: str, root: Path) -> tuple[list[dict[str, Any]], Any]:
    store: ExperimentStore | None = None
    for where in (root, None):
        try:
            _, store = find_experiment(experiment_id, where)
            break
        except ExperimentNotFound:
            continue
    if store is None:
        raise WarmStartError(f"warm start: no experiment {experiment_id!r} found (under {root} or where "
                             "`trialflow experiment list` looks); give its id or an exported file")
    try:
        space = config_in_force(store.experiment())[0].get("searchSpace")
        return [r for r in export_rows(store, intermediate=False) if r["value"] is not None], space
    finally:
        store.close()


def _file_rows(path: Path) -> Any:
    try:
        return read_results_file(path, "a warm-start file")
    except FileNotFoundError:
        raise WarmStartError(f"warm start: {path} is neither a file nor an experiment id; give an experiment's id "
                             "or a file of `trialflow experiment export --type json`") from None
    except ValueError as exc:
        raise WarmStartError(f"warm start: {exc}") from None


def _fitting(config: ExperimentConfig, rows: list[dict[str, Any]]
             ) -> tuple[list[ImportedItem], int]:
    """The rows whose values the new search space holds, as items; and how many it does not."""
    items, left_out = [], 0
    for row in rows:
        try:
            items.extend(import_items(config, [row]))
        except ValueError:
            left_out += 1
    return items, left_out


def space_differences(old: Any, new: Any) -> list[str]:
    """Each parameter in which two search spaces differ in name or ``_type``, as a phrase."""
    old, new = old or {}, new or {}
    problems = [f"its parameter {name!r} is not in this search space" for name in old if name not in new]
    problems += [f"parameter {name!r} is not in its search space" for name in new if name not in old]
    for name in old:
        if name in new:
            before, now = (old[name] or {}).get("_type"), (new[name] or {}).get("_type")
            if before != now:
                problems.append(f"parameter {name!r} is {before} there and {now} here")
    return problems
