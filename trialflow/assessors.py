"""Assessors: when to stop a running trial early, from its intermediate results (NNI §7.1).

``Medianstop``: from ``start_step`` on, a trial whose best result so far is strictly worse than the
median of the completed trials' running averages at the same step is stopped.
``Curvefitting``: from ``start_step`` on (every ``gap`` steps) the learning curve is extrapolated
to ``epoch_num``; a trial whose predicted final value is worse than ``threshold`` times the best
final value so far is stopped.
``ASHA`` and ``Hyperband`` (beyond NNI; Optuna's ``SuccessiveHalvingPruner`` and ``HyperbandPruner``):
asynchronous successive halving over the intermediate results of any tuner's trials. A trial that
reaches a rung (``min_resource * reduction_factor**k`` results) goes on only when it is among the
best ``1/reduction_factor`` of the trials seen at that rung; Hyperband runs several such schedules
(brackets) side by side and assigns each trial to one.
``MOASHA`` (beyond NNI; experiments with ``objectives``): the same rungs over several objectives and
constraints, the trials at a rung ordered by :meth:`Objectives.ranked` (feasible first, by
non-dominated front, then crowding distance).

Lifecycle: ``assess(trial_id, history)`` after each new intermediate result returns True to stop;
``trial_end(trial_id, history, succeeded)`` once when the trial ends.
"""

from __future__ import annotations

import statistics
import threading
from abc import ABC, abstractmethod
from typing import Any

from .foundation.optuna_logging import quietly
from .tuners import AlgorithmSpec
from .tuners.base import (
    TunerError,
    check_args,
    number_arg,
    optimize_mode_arg,
    positive_int_arg,
)
from .tuners.custom import Checkpoint, check_algorithm, describe_failure, is_custom, load_custom
from .tuners.objectives import MultiResult, Objectives


def _nonneg_int(value: Any) -> str | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return None if ok else "must be a non-negative integer"


class Assessor(ABC):
    """``failure`` is set when a customized assessor raised; the experiment then ends ERROR."""

    failure: str | None = None
    multi_objective = False  # True: told MultiResult histories (``trialflow.tuners.objectives``), not numbers

    def __init__(self, optimize_mode: str = "maximize") -> None:
        self.maximize = optimize_mode == "maximize"

    def better(self, a: float, b: float) -> bool:
        return a > b if self.maximize else a < b

    @abstractmethod
    def assess(self, trial_id: str, history: list[float]) -> bool: ...

    def trial_end(self, trial_id: str, history: list[float], succeeded: bool) -> None:
        """Called once when a trial ends (default: nothing to learn)."""
        return None

    def next_decision(self, step: int) -> int | None:
        """The first number of intermediate results after ``step`` at which :meth:`assess` may stop a
        trial (None: never again). A trial waits for the assessor's word at report time only there
        (``trialflow.platforms.report_desk``). Default: at every result."""
        return step + 1


class MedianstopAssessor(Assessor):
    def __init__(self, optimize_mode: str = "maximize", start_step: int = 0) -> None:
        super().__init__(optimize_mode)
        self.start_step = start_step
        self._completed: list[list[float]] = []  # running averages of completed trials

    def trial_end(self, trial_id: str, history: list[float], succeeded: bool) -> None:
        if succeeded and history:
            self._completed.append([sum(history[: i + 1]) / (i + 1) for i in range(len(history))])

    def next_decision(self, step: int) -> int | None:
        return max(step + 1, self.start_step + 1)

    def assess(self, trial_id: str, history: list[float]) -> bool:
        step = len(history)
        if step <= self.start_step or not self._completed:
            return False
        at_step = [avgs[step - 1] if len(avgs) >= step else avgs[-1] for avgs in self._completed]
        median = statistics.median(at_step)
        best = max(history) if self.maximize else min(history)
        return self.better(median, best)


class CurvefittingAssessor(Assessor):
    def __init__(self, epoch_num: int = 20, start_step: int = 6, threshold: float = 0.95, gap: int = 1,
                 optimize_mode: str = "maximize") -> None:
        super().__init__(optimize_mode)
        self.epoch_num, self.start_step, self.threshold, self.gap = epoch_num, start_step, threshold, gap
        self._best_final: float | None = None
        self._judged: dict[str, int] = {}  # trial -> the history length it was last assessed at
        self._lock = threading.Lock()

    def trial_end(self, trial_id: str, history: list[float], succeeded: bool) -> None:
        with self._lock:
            self._judged.pop(trial_id, None)
        if succeeded and history:
            final = history[-1]
            if self._best_final is None or self.better(final, self._best_final):
                self._best_final = final

    def predict(self, history: list[float]) -> float:
        """Final value at ``epoch_num``, extrapolated by least squares with a log curve
        a + b*log(x) and a straight line; the more optimistic of the two is used, so a trial is
        stopped only when both curve families predict it to fall short."""
        import numpy as np  # here: a command that checks a config never loads numpy for it

        x = np.arange(1, len(history) + 1, dtype=float)
        y = np.asarray(history, dtype=float)
        predictions = []
        for feature, at_end in ((np.log(x), np.log(self.epoch_num)), (x, float(self.epoch_num))):
            design = np.column_stack([np.ones_like(x), feature])
            coef, *_ = np.linalg.lstsq(design, y, rcond=None)
            predictions.append(float(coef[0] + coef[1] * at_end))
        return max(predictions) if self.maximize else min(predictions)

    def next_decision(self, step: int) -> int | None:
        if step < self.start_step:
            return self.start_step
        return step + self.gap - (step - self.start_step) % self.gap

    def _due(self, step: int) -> bool:
        return step >= self.start_step and (step - self.start_step) % self.gap == 0

    def assess(self, trial_id: str, history: list[float]) -> bool:
        """Judged when a step of the schedule (``start_step``, then every ``gap``) is among the results
        that came since the last call: results read together never skip a judgement."""
        step = len(history)
        with self._lock:
            since = self._judged.get(trial_id, 0)
            self._judged[trial_id] = step
        if not any(self._due(s) for s in range(since + 1, step + 1)) or self._best_final is None:
            return False
        predicted = self.predict(history)
        if self.maximize:
            return predicted < self.threshold * self._best_final
        return predicted > self._best_final / self.threshold


class PrunerAssessor(Assessor):
    """An Optuna pruner over an in-memory study: one study trial per experiment trial, its
    intermediate results reported at steps 1, 2, ... Called from many trial threads: a lock keeps
    the bookkeeping consistent (Optuna's in-memory storage is thread-safe itself)."""

    def __init__(self, pruner: Any, optimize_mode: str) -> None:
        import optuna

        super().__init__(optimize_mode)
        with quietly():
            self.study = optuna.create_study(direction="maximize" if self.maximize else "minimize", pruner=pruner,
                                             sampler=optuna.samplers.RandomSampler(seed=0))
        self._trials: dict[str, Any] = {}
        self._reported: dict[str, int] = {}
        self._lock = threading.Lock()

    def _report(self, trial_id: str, history: list[float]) -> tuple[Any, bool]:
        """Report the results not reported yet, each followed by the pruner's verdict (which records
        the trial's value at every rung it passes); returns the trial and whether a verdict said stop.
        Reporting ends at the first "stop": the pruner judges a rung only at its own step, so a
        verdict at a rung that results read together went past is never lost."""
        trial = self._trials.get(trial_id)
        if trial is None:
            trial = self._trials[trial_id] = self.study.ask()
        prune = False
        step = self._reported.get(trial_id, 0)
        while step < len(history) and not prune:
            trial.report(history[step], step + 1)
            prune = trial.should_prune()
            step += 1
        self._reported[trial_id] = step
        return trial, prune

    def assess(self, trial_id: str, history: list[float]) -> bool:
        with self._lock:
            return bool(self._report(trial_id, history)[1])

    def trial_end(self, trial_id: str, history: list[float], succeeded: bool) -> None:
        from optuna.trial import TrialState

        with self._lock:
            trial, _ = self._report(trial_id, history)
            self._trials.pop(trial_id, None)
            self._reported.pop(trial_id, None)
            if succeeded and history:
                with quietly():
                    self.study.tell(trial, history[-1])
            else:
                with quietly():
                    self.study.tell(trial, state=TrialState.PRUNED if history else TrialState.FAIL)


def _min_resource(value: Any) -> str | None:
    ok = value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value > 0)
    return None if ok else "must be a positive integer or 'auto'"


def _reduction_factor(value: Any) -> str | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 2
    return None if ok else "must be an integer of at least 2"


class AshaAssessor(PrunerAssessor):
    def __init__(self, optimize_mode: str = "maximize", min_resource: int | str = 1, reduction_factor: int = 3,
                 min_early_stopping_rate: int = 0) -> None:
        import optuna

        pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource, reduction_factor, min_early_stopping_rate)
        super().__init__(pruner, optimize_mode)
        # the steps where a trial may be stopped: min_resource * reduction_factor**(rate + k), k = 0, 1, ...
        self._first_rung = None if min_resource == "auto" else \
            int(min_resource) * reduction_factor ** min_early_stopping_rate
        self._reduction_factor = reduction_factor

    def next_decision(self, step: int) -> int | None:
        if self._first_rung is None:  # "auto": the rungs are known once a trial has ended
            return step + 1
        rung = self._first_rung
        while rung <= step:
            rung *= self._reduction_factor
        return rung


class HyperbandAssessor(PrunerAssessor):
    def __init__(self, optimize_mode: str = "maximize", min_resource: int = 1, max_resource: int | str = "auto",
                 reduction_factor: int = 3) -> None:
        import optuna

        super().__init__(optuna.pruners.HyperbandPruner(min_resource, max_resource, reduction_factor), optimize_mode)


class MultiObjectiveAshaAssessor(Assessor):
    """Asynchronous successive halving over several objectives. A trial whose ``min_resource *
    reduction_factor**k``-th intermediate result is in (rung ``k``) goes on only when that result is
    among the first ``max(n // reduction_factor, 1)`` of the ``n`` results seen at that rung, ordered by
    :meth:`Objectives.ranked`: a trial dominated by most of its rung is stopped, and an infeasible one
    ranks after every feasible one. Rungs a history skips over are judged in turn. With ``max_resource``
    (the number of intermediate results of a trial that trains to the end) there is no rung at or beyond
    it: a trial that has trained fully is never stopped as its final result comes. Thread-safe."""

    multi_objective = True

    def __init__(self, objectives: Objectives, min_resource: int = 1, reduction_factor: int = 3,
                 max_resource: int | None = None) -> None:
        super().__init__()
        self.objectives = objectives
        self.min_resource = min_resource
        self.reduction_factor = reduction_factor
        self.max_resource = max_resource
        self.rungs: dict[int, dict[str, MultiResult]] = {}  # rung -> trial -> its result there
        self._lock = threading.Lock()

    def assess(self, trial_id: str, history: list[MultiResult | None]) -> bool:  # type: ignore[override]
        with self._lock:
            rung, steps = 0, self.min_resource
            while steps <= len(history) and (self.max_resource is None or steps < self.max_resource):
                seen = self.rungs.setdefault(rung, {})
                result = history[steps - 1]
                if trial_id not in seen and result is not None:
                    seen[trial_id] = result
                    keep = max(len(seen) // self.reduction_factor, 1)
                    if self.objectives.ranked(seen).index(trial_id) >= keep:
                        return True
                rung, steps = rung + 1, steps * self.reduction_factor
            return False


ASSESSORS = {
    "medianstop": (MedianstopAssessor, {"optimize_mode": optimize_mode_arg, "start_step": _nonneg_int}),
    "curvefitting": (CurvefittingAssessor, {"optimize_mode": optimize_mode_arg, "epoch_num": positive_int_arg,
                                            "start_step": _nonneg_int, "threshold": number_arg,
                                            "gap": positive_int_arg}),
    "asha": (AshaAssessor, {"optimize_mode": optimize_mode_arg, "min_resource": _min_resource,
                            "reduction_factor": _reduction_factor, "min_early_stopping_rate": _nonneg_int}),
    "hyperband": (HyperbandAssessor, {"optimize_mode": optimize_mode_arg, "min_resource": positive_int_arg,
                                      "max_resource": _min_resource, "reduction_factor": _reduction_factor}),
    "moasha": (MultiObjectiveAshaAssessor, {"min_resource": positive_int_arg, "reduction_factor": _reduction_factor,
                                            "max_resource": positive_int_arg}),
}
MULTI_OBJECTIVE_ASSESSORS = frozenset({"moasha"})  # they need the config's objectives
KNOWN_ASSESSORS = "Medianstop, Curvefitting, ASHA, Hyperband, MOASHA"
NNI_NAMES = {"medianstop": "Medianstop", "curvefitting": "Curvefitting", "asha": "ASHA", "hyperband": "Hyperband",
             "moasha": "MOASHA"}


class NniAssessor(Assessor):
    """A customized assessor written against NNI's ``nni.assessor.Assessor`` API: ``assess_trial``
    answering ``AssessResult.Bad`` stops the trial; it is bound to the experiment's ``checkpoint``, whose
    ``load_checkpoint()`` is called once first when the run resumes. An exception of it is kept in
    :attr:`failure` (traceback in the log), answers "go on" and ends the experiment as ERROR from its loop."""

    def __init__(self, assessor: Any, checkpoint: Checkpoint | None = None) -> None:
        self.assessor = assessor
        self.maximize = True
        if checkpoint is not None:
            checkpoint.attach(assessor)
            if checkpoint.resumed:
                self._call("load_checkpoint")

    def _call(self, method: str, *args: Any) -> Any:
        if self.failure is not None:
            return None
        try:
            return getattr(self.assessor, method)(*args)
        except Exception as exc:  # noqa: BLE001 -- recorded; the experiment loop ends the run
            self.failure = describe_failure(self.assessor, method, exc)
            return None

    def assess(self, trial_id: str, history: list[float]) -> bool:
        verdict = self._call("assess_trial", trial_id, list(history))
        # NNI's AssessResult.Bad has the value False; a plain False means the same
        return verdict is not None and getattr(verdict, "value", verdict) is False

    def trial_end(self, trial_id: str, history: list[float], succeeded: bool) -> None:
        self._call("trial_end", trial_id, succeeded)


def check_assessor(config: AlgorithmSpec) -> None:
    """The assessor's name and ``classArgs``, checked as NNI checks them at ``nnictl create`` (a
    customized one's class is loaded and its ``classArgsValidator`` run); nothing is built. Raises
    :class:`TunerError`."""
    check_algorithm(config, "assessor", Assessor, ASSESSORS, KNOWN_ASSESSORS)


def create_assessor(config: AlgorithmSpec, objectives: Objectives | None = None,
                    checkpoint: Checkpoint | None = None) -> Assessor:
    """The configured assessor: a built-in name, a ``className`` or a registered name; the experiment's
    ``objectives`` go to one that takes them (:data:`MULTI_OBJECTIVE_ASSESSORS`), which needs them; an
    NNI-API customized one is bound to the experiment's ``checkpoint`` and loads it first when the run
    resumes."""
    if is_custom(config, ASSESSORS):
        custom = load_custom(config, "assessor", Assessor)
        if issubclass(custom.cls, Assessor):
            return custom.instantiate()  # type: ignore[no-any-return]
        return NniAssessor(custom.instantiate(), checkpoint)
    name = (config.name or "").lower()
    if name not in ASSESSORS:
        raise TunerError(f"unknown assessor {config.name!r}; built-in: {KNOWN_ASSESSORS}")
    cls, allowed = ASSESSORS[name]
    args = check_args(f"assessor {config.name}", config.class_args, allowed)
    if name in MULTI_OBJECTIVE_ASSESSORS:
        if objectives is None:
            raise TunerError(f"assessor {config.name} needs objectives in the config")
        args["objectives"] = objectives
    return cls(**args)  # type: ignore[abstract]
