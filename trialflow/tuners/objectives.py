"""Several objectives and constraints: what a trial's final-result dict is worth to a multi-objective
experiment, and which results are Pareto-optimal.

An experiment with ``objectives`` in its config reads each final result as the values of those keys
(:func:`multi_result`); ``constraints`` bound other keys (or the same), and a result is feasible when
every bound holds. Violations follow Optuna's convention: a number per constraint, at most 0 when
its bound holds. The Pareto set (:func:`pareto_optimal`) is the feasible results no other feasible
result dominates under the objectives' directions. Standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from .base import InvalidMetric, extract_scalar, scalar_or_none

K = TypeVar("K", bound=Hashable)
PAREGO_RHO = 0.05  # the weight of the weighted sum in ParEGO's augmented Chebyshev function


@dataclass(frozen=True)
class Objective:
    name: str
    maximize: bool


@dataclass(frozen=True)
class Bound:
    name: str
    min: float | None = None
    max: float | None = None


@dataclass(frozen=True)
class MultiResult:
    """A final result as a multi-objective experiment reads it: one value per objective, in the
    config's order, and one violation per constraint (at most 0: the bound holds)."""

    values: tuple[float, ...]
    violations: tuple[float, ...] = ()

    @property
    def feasible(self) -> bool:
        return all(v <= 0 for v in self.violations)


@dataclass(frozen=True)
class Objectives:
    """An experiment's objectives and constraints, as its config states them."""

    objectives: tuple[Objective, ...]
    bounds: tuple[Bound, ...] = ()

    @classmethod
    def of_config(cls, config: dict[str, Any]) -> Objectives | None:
        """From a config as stored (camelCase keys); None for a single-objective experiment."""
        objectives = config.get("objectives")
        if not objectives:
            return None
        return cls(tuple(Objective(o["name"], o.get("direction") == "maximize") for o in objectives),
                   tuple(Bound(c["name"], c.get("min"), c.get("max")) for c in config.get("constraints") or ()))

    @property
    def names(self) -> list[str]:
        return [o.name for o in self.objectives]

    def read(self, final: Any) -> MultiResult:
        """The result ``final`` (a dict) as this experiment reads it. Raises :class:`InvalidMetric`
        naming what is missing or not a finite number."""
        if not isinstance(final, dict):
            raise InvalidMetric(f"a multi-objective experiment needs a dict final result with the keys "
                                f"{', '.join(self.names)}, got {type(final).__name__}")
        values = tuple(_number(final, o.name, "objective") for o in self.objectives)
        violations = []
        for bound in self.bounds:
            value = _number(final, bound.name, "constraint")
            violations.append(max(value - bound.max if bound.max is not None else -math.inf,
                                  bound.min - value if bound.min is not None else -math.inf))
        return MultiResult(values, tuple(violations))

    def read_or_none(self, final: Any) -> MultiResult | None:
        """:meth:`read`, or None for a missing or unusable result."""
        if final is None:
            return None
        try:
            return self.read(final)
        except InvalidMetric:
            return None

    def read_intermediate(self, value: Any) -> MultiResult | None:
        """An intermediate result as an assessor reads it: its objectives' values (None when one is
        missing or unusable) and the violations of the bounds whose keys it has (a bound whose key is
        not there yet holds)."""
        if not isinstance(value, dict):
            return None
        try:
            values = tuple(_number(value, o.name, "objective") for o in self.objectives)
            present = tuple(b for b in self.bounds if b.name in value)
            violations = Objectives((), present).read(value).violations if present else ()
        except InvalidMetric:
            return None
        return MultiResult(values, violations)

    def minimised(self, values: Sequence[float]) -> tuple[float, ...]:
        """``values`` as costs: lower is better in every objective (a maximized one negated)."""
        return tuple(-v if o.maximize else v for o, v in zip(self.objectives, values, strict=True))

    def scalarized(self, results: Sequence[MultiResult], weights: Sequence[float]) -> list[float]:
        """One cost per result (lower is better), for a tuner whose model takes one number: ParEGO's
        augmented Chebyshev function with ``weights`` (one per objective, summing to 1) over the
        objectives normalised to [0, 1] across ``results``. A feasible result costs at most
        1 + :data:`PAREGO_RHO`; an infeasible one more than that, growing with its total violation."""
        points = [self.minimised(r.values) for r in results]
        lows, highs = [min(c) for c in zip(*points, strict=True)], [max(c) for c in zip(*points, strict=True)]
        costs = []
        for result, point in zip(results, points, strict=True):
            if result.feasible:
                scaled = [w * ((x - lo) / (hi - lo) if hi > lo else 0.0)
                          for w, x, lo, hi in zip(weights, point, lows, highs, strict=True)]
                costs.append(max(scaled) + PAREGO_RHO * sum(scaled))
            else:
                violation = sum(max(v, 0.0) for v in result.violations)
                costs.append(1 + PAREGO_RHO + violation / (1 + violation))
        return costs

    def dominates(self, a: Sequence[float], b: Sequence[float]) -> bool:
        """Whether values ``a`` are at least as good as ``b`` in every objective and better in one."""
        better = False
        for objective, x, y in zip(self.objectives, a, b, strict=True):
            if (x < y) if objective.maximize else (x > y):
                return False
            better = better or x != y
        return better

    def pareto_optimal(self, results: dict[K, MultiResult]) -> list[K]:
        """The keys of the feasible results that no other feasible result dominates, in their order."""
        feasible = {k: r.values for k, r in results.items() if r.feasible}
        return [k for k, v in feasible.items() if not any(self.dominates(w, v) for w in feasible.values())]

    def ranked(self, results: dict[K, MultiResult]) -> list[K]:
        """The keys best first: the feasible results by non-dominated front (the Pareto-optimal ones,
        then those only they dominate, ...), within a front by crowding distance (the most isolated
        first; the extremes of each objective lead), then the infeasible ones by their total
        violation. Ties keep the given order."""
        feasible = {k: r.values for k, r in results.items() if r.feasible}
        order: list[K] = []
        remaining = list(feasible)
        while remaining:
            front = [k for k in remaining if not any(self.dominates(feasible[j], feasible[k]) for j in remaining)]
            distance = _crowding_distance(front, feasible)
            order += sorted(front, key=lambda k: -distance[k])
            remaining = [k for k in remaining if k not in set(front)]
        infeasible = [k for k, r in results.items() if not r.feasible]
        return order + sorted(infeasible, key=lambda k: sum(max(v, 0.0) for v in results[k].violations))


def hypervolume(objectives: Objectives, points: list[Sequence[float]], reference: Sequence[float]) -> float:
    """The volume that ``points`` (values of ``objectives``) dominate up to ``reference`` (a point worse
    than all of them in every objective; a point not better than it in every objective adds nothing):
    the slicing algorithm, exact, for the tens to hundreds of results of an experiment."""
    ref = objectives.minimised(reference)
    inside = [p for p in map(objectives.minimised, points) if all(x < r for x, r in zip(p, ref, strict=True))]
    return _sliced_volume(inside, ref)


def _sliced_volume(points: list[tuple[float, ...]], ref: tuple[float, ...]) -> float:
    if not points:
        return 0.0
    if len(ref) == 1:
        return ref[0] - min(p[0] for p in points)
    ordered = sorted(points, key=lambda p: p[-1])
    volume = 0.0
    for i, point in enumerate(ordered):
        upper = ordered[i + 1][-1] if i + 1 < len(ordered) else ref[-1]
        if upper > point[-1]:
            volume += (upper - point[-1]) * _sliced_volume([q[:-1] for q in ordered[:i + 1]], ref[:-1])
    return volume


def _crowding_distance(front: list[K], values: dict[K, tuple[float, ...]]) -> dict[K, float]:
    """NSGA-II's crowding distance of each member of ``front``: the sum over objectives of the normalised
    gap between its neighbours; the extremes of each objective get infinity."""
    distance = dict.fromkeys(front, 0.0)
    if len(front) <= 2:
        return dict.fromkeys(front, math.inf)
    for i in range(len(values[front[0]])):
        line = sorted(front, key=lambda k: values[k][i])
        low, high = values[line[0]][i], values[line[-1]][i]
        distance[line[0]] = distance[line[-1]] = math.inf
        if high == low:
            continue
        for before, member, after in zip(line, line[1:], line[2:], strict=False):
            distance[member] += (values[after][i] - values[before][i]) / (high - low)
    return distance


def _number(final: dict, key: str, what: str) -> float:
    if key not in final:
        raise InvalidMetric(f"the final result has no {what} {key!r} (its keys: {', '.join(map(str, final))})")
    value = final[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(float(value)):
        raise InvalidMetric(f"the {what} {key!r} of the final result must be a finite number, got {value!r}")
    return float(value)


def tuner_value(final: Any, objectives: Objectives | None) -> float | MultiResult | None:
    """What the tuner is told of a SUCCEEDED trial's final result: a number (one objective, NNI's
    rule), a :class:`MultiResult` (several), or None when the result is missing or unusable."""
    return scalar_or_none(final) if objectives is None else objectives.read_or_none(final)


def read_result(final: Any, objectives: Objectives | None) -> float | MultiResult:
    """:func:`tuner_value` of a present result; raises :class:`InvalidMetric` saying why it is unusable."""
    return extract_scalar(final) if objectives is None else objectives.read(final)
