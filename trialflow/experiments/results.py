"""An experiment's results, read one way everywhere (summary, ``view``, ``trial ls``, export, report,
artifacts, dashboard, Python API): the metric's direction, a trial's usable value, the best trial and
the counts by outcome.

The direction is decided once, when the experiment is created, by NNI's rule (its WebUI's
``optimizeMode``): the ``optimize_mode`` of the tuner's ``classArgs``, else the advisor's, else the
assessor's, else maximize. It is stored with the experiment; experiments stored before it was are
read with the same rule over their stored config.

An experiment with ``objectives`` in its config has no best trial: its Pareto set
(:func:`pareto_set`: the SUCCEEDED trials whose results are feasible and not dominated) stands for it.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from ..foundation.status import TrialStatus
from ..records.store_records import ExperimentRecord, TrialRecord
from ..trial.protocol import STDERR_FILE, STDERR_TAIL
from ..tuners import scalar_or_none
from ..tuners.objectives import MultiResult, Objectives

if TYPE_CHECKING:
    from ..records.store import ExperimentStore

MODES = ("maximize", "minimize")
# The order outcomes are counted and printed in.
OUTCOMES = (TrialStatus.SUCCEEDED, TrialStatus.FAILED, TrialStatus.EARLY_STOPPED, TrialStatus.USER_CANCELED,
            TrialStatus.SYS_CANCELED, TrialStatus.RUNNING, TrialStatus.WAITING)


def optimize_mode_of(config: dict[str, Any]) -> str:
    """``maximize`` or ``minimize`` for a config as stored (camelCase keys), by NNI's rule."""
    for section in ("tuner", "advisor", "assessor"):
        mode = ((config.get(section) or {}).get("classArgs") or {}).get("optimize_mode")
        if mode in MODES:
            return str(mode)
    return "maximize"


def exited_by_itself(exit_code: int | None) -> bool:
    """An exit code of the trial's own choosing; a kill ends it by a signal (negative, or 128 + signal
    through a shell)."""
    return exit_code is not None and 0 <= exit_code < 128


def maximizes(record: ExperimentRecord) -> bool:
    """Whether the experiment's metric is maximised: its stored direction."""
    return (record.optimize_mode or optimize_mode_of(record.config)) == "maximize"


def trial_value(trial: TrialRecord) -> float | None:
    """The trial's final result as a number (None when it has none, or none usable)."""
    return scalar_or_none(trial.final)


def best_trial(trials: list[TrialRecord], maximize: bool) -> TrialRecord | None:
    """The SUCCEEDED trial with the best usable final result (the earliest on a tie); None if none."""
    scored = [(v, t) for t in trials if t.status == TrialStatus.SUCCEEDED and (v := trial_value(t)) is not None]
    if not scored:
        return None
    return (max if maximize else min)(scored, key=lambda pair: pair[0])[1]


def multi_objective(record: ExperimentRecord) -> Objectives | None:
    """The experiment's objectives and constraints (None: one objective, the final result)."""
    return Objectives.of_config(record.config)


def multi_results(trials: list[TrialRecord], objectives: Objectives) -> dict[str, MultiResult]:
    """The usable final results of ``trials`` (whatever their status), by trial id, in the order given."""
    return {t.id: r for t in trials if (r := objectives.read_or_none(t.final)) is not None}


def succeeded(trials: list[TrialRecord]) -> list[TrialRecord]:
    return [t for t in trials if t.status == TrialStatus.SUCCEEDED]


def pareto_set(trials: list[TrialRecord], objectives: Objectives) -> list[TrialRecord]:
    """The SUCCEEDED trials whose final results are usable and feasible and that no other such trial
    dominates, in the order given."""
    front = set(objectives.pareto_optimal(multi_results(succeeded(trials), objectives)))
    return [t for t in trials if t.id in front]


def pareto_lines(record: ExperimentRecord, trials: list[TrialRecord]) -> list[str] | None:
    """A multi-objective experiment's Pareto set as printed at its end and by ``view``: a heading and
    a line per trial (its objectives' values and parameters); None for a single-objective one."""
    objectives = multi_objective(record)
    if objectives is None:
        return None
    front = pareto_set(trials, objectives)
    lines = [f"Pareto set: {len(front)} trial{'s' if len(front) != 1 else ''} "
             f"({', '.join(f'{o.name} {_arrow(o.maximize)}' for o in objectives.objectives)})"]
    for t in front:
        values = objectives.read(t.final).values
        shown = ", ".join(f"{name} {value:.6g}" for name, value in zip(objectives.names, values, strict=True))
        lines.append(f"  {t.id} (#{t.sequence}): {shown}; parameters {t.parameters}")
    return lines


def _arrow(maximize: bool) -> str:
    return "max" if maximize else "min"


def ranked(trials: list[TrialRecord], maximize: bool) -> list[TrialRecord]:
    """Trials with a usable final result, best first (``best_trial`` is the first SUCCEEDED one)."""
    scored = [t for t in trials if trial_value(t) is not None]
    return sorted(scored, key=lambda t: trial_value(t), reverse=maximize)  # type: ignore[arg-type,return-value]


def outcome_counts(trials: list[TrialRecord]) -> dict[str, int]:
    """How many trials are in each status, in :data:`OUTCOMES` order (statuses with none left out)."""
    counts = Counter(t.status for t in trials)
    return {status: counts[status] for status in OUTCOMES if counts[status]}


def outcome_line(trials: list[TrialRecord]) -> str:
    """``"12 trials: 9 SUCCEEDED, 2 FAILED, 1 EARLY_STOPPED"`` (or ``"0 trials"``)."""
    counts = outcome_counts(trials)
    text = f"{len(trials)} trial{'s' if len(trials) != 1 else ''}"
    return text + (": " + ", ".join(f"{n} {s}" for s, n in counts.items()) if counts else "")


def nothing_succeeded(trials: list[TrialRecord], experiment_id: str | None = None) -> str | None:
    """The failure message of an experiment whose trials all ended without success (None otherwise, and
    for an experiment without trials): ``"no trial succeeded, 3 failed, 1 early-stopped"``; given the
    experiment's id, also what the last failed trial said (its message and the last line of its
    stderr, from its folder when that is on this machine, else from the stderr tail its message carries;
    one line) and the command that shows its output."""
    if not trials or any(t.status == TrialStatus.SUCCEEDED for t in trials):
        return None
    counts = outcome_counts(trials)
    parts = [f"{counts[s]} {s.lower().replace('_', '-')}" for s in OUTCOMES[1:] if s in counts]
    line = "no trial succeeded, " + ", ".join(parts)
    failed = [t for t in trials if t.status == TrialStatus.FAILED]
    if experiment_id is None or not failed:
        return line
    last = failed[-1]
    # a message with_stderr_tail made ("exit code 3; stderr tail:\n<lines>"): its first line, and the
    # stderr's last line once
    head, _, tail = (last.message or "").partition("\n")
    stderr = _last_stderr_line(last) or _last_line(tail)
    said = "; ".join(x for x in (head.removesuffix(STDERR_TAIL), stderr and f"stderr: {stderr}") if x)
    return (f"{line} (trial {last.id}: {said or 'no message'}); its output: "
            f"trialflow log trial {experiment_id} {last.id}")


def _last_stderr_line(trial: TrialRecord, limit: int = 4096) -> str | None:
    """The last non-empty line of the trial's stderr, when its folder is on this machine."""
    if not trial.log_dir:
        return None
    try:
        with open(f"{trial.log_dir}/{STDERR_FILE}", "rb") as stream:
            stream.seek(0, 2)
            stream.seek(max(stream.tell() - limit, 0))
            return _last_line(stream.read().decode("utf-8", "replace"))
    except OSError:
        return None


def _last_line(text: str) -> str | None:
    """The last non-empty line of ``text``, stripped and cut to 200 characters."""
    line = next((x.strip() for x in reversed(text.splitlines()) if x.strip()), None)
    return line[:200] if line else None


def expected_best(record: ExperimentRecord, trials: list[TrialRecord]) -> str | None:
    """The id of the best trial under the experiment's stored direction; None for a multi-objective one."""
    if multi_objective(record) is not None:
        return None
    best = best_trial(trials, maximizes(record))
    return best.id if best is not None else None


def expected_pareto(record: ExperimentRecord, trials: list[TrialRecord]) -> list[str] | None:
    """The ids of the Pareto set under the experiment's stored objectives; None for a single-objective one."""
    objectives = multi_objective(record)
    return None if objectives is None else [t.id for t in pareto_set(trials, objectives)]


def end_experiment(store: ExperimentStore, status: str, message: str | None = None) -> None:
    """Record the experiment's end: its status (DONE, STOPPED, ERROR), the message, the end time, no
    controller, and its best trial or Pareto set as the record then stands."""
    record, trials = store.experiment(), store.trials()
    store.set_experiment(status=status, message=message, end_time=time.time(), controller_pid=None,
                         best_trial=expected_best(record, trials), pareto=expected_pareto(record, trials))
