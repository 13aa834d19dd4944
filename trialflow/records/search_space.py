"""NNI search spaces: validation, and sampling with NNI's exact semantics (docs/nni.md#search-space).

A space is walked with a :class:`Chooser`, which picks a raw value for every *key* (a flat, unique
name; nested ``choice`` options get ``parent/option/child`` keys). Raw values live in a small
internal space -- an option index, an integer, or a unit value ``u`` in (0, 1) -- and
:meth:`SearchSpace.sample` turns them into the user's parameters:

* ``uniform``/``loguniform``: linear or log interpolation between low and high;
* ``normal`` family: ``mu + sigma * Phi^-1(u)`` (so a uniform ``u`` gives an exact normal);
* ``q`` types: ``round(x / q) * q``, clipped to [low, high] for quniform/qloguniform only;
* ``randint``: an integer in [lower, upper) -- the upper bound is exclusive;
* nested ``choice``: ``{"_name": option, <sub-parameters>...}`` when every option has ``_name``;
  options without ``_name`` (any JSON value, dicts too) are plain values, as NNI allows.

Tuners differ only in how they choose the raw values, so every tuner supports every type.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any, Protocol

from ..foundation.user_errors import UserError

TYPES = ("choice", "randint", "uniform", "quniform", "loguniform", "qloguniform",
         "normal", "qnormal", "lognormal", "qlognormal")
_Q_TYPES = {"quniform", "qloguniform", "qnormal", "qlognormal"}
_NORMAL_TYPES = {"normal", "qnormal", "lognormal", "qlognormal"}
_STANDARD_NORMAL = NormalDist()
_U_EPS = 1e-12


class SearchSpaceError(UserError, ValueError):
    """A search space that breaks NNI's rules; the message names the parameter and the rule."""


class Chooser(Protocol):
    """Picks raw values while a space is walked (one call per key)."""

    def categorical(self, key: str, n: int) -> int: ...
    def integer(self, key: str, low: int, high: int) -> int: ...  # inclusive bounds
    def unit(self, key: str) -> float: ...  # in (0, 1)


@dataclass(frozen=True)
class Option:
    """A nested-choice option: ``{"_name": name, ...sub-space}``."""

    name: Any
    space: SearchSpace


@dataclass(frozen=True)
class Param:
    name: str
    type: str
    values: tuple[Any, ...]

    @property
    def is_continuous(self) -> bool:
        return self.type not in ("choice", "randint") and not self.is_finite_q

    @property
    def is_finite_q(self) -> bool:
        return self.type in ("quniform", "qloguniform")

    def decode_unit(self, u: float) -> float:
        """The parameter value for a unit value ``u`` (NNI's formulas)."""
        u = min(max(u, _U_EPS), 1 - _U_EPS)
        v = self.values
        if self.type in ("uniform", "quniform"):
            x = v[0] + u * (v[1] - v[0])
        elif self.type in ("loguniform", "qloguniform"):
            x = math.exp(math.log(v[0]) + u * (math.log(v[1]) - math.log(v[0])))
        else:
            x = v[0] + v[1] * _STANDARD_NORMAL.inv_cdf(u)
            if self.type in ("lognormal", "qlognormal"):
                x = math.exp(min(x, 700.0))
        if self.type in _Q_TYPES:
            x = round(x / v[2]) * v[2]
            if self.type in ("quniform", "qloguniform"):
                x = min(max(x, v[0]), v[1])
        return float(x)

    def encode_value(self, x: float) -> float:
        """The unit value of a parameter value (clamped into (0, 1))."""
        v = self.values
        if self.type in ("uniform", "quniform", "loguniform", "qloguniform"):
            u = self.unit_of(min(max(x, v[0]), v[1]))
        else:
            if self.type in ("lognormal", "qlognormal"):
                x = math.log(max(x, 1e-300))
            u = _STANDARD_NORMAL.cdf((x - v[0]) / v[1])
        return min(max(u, _U_EPS), 1 - _U_EPS)

    def unit_of(self, x: float) -> float:
        """The unit value that decodes to ``x`` (inverse of decode_unit for uniform/loguniform kinds)."""
        low, high = self.values[0], self.values[1]
        if self.type in ("loguniform", "qloguniform"):
            return (math.log(x) - math.log(low)) / (math.log(high) - math.log(low))
        return (x - low) / (high - low)

    def grid_values(self) -> list[float]:
        """All values of a finite quantised type, in order (clipped multiples of q)."""
        low, high, q = self.values
        values = {min(max(k * q, low), high) for k in range(math.floor(low / q), math.ceil(high / q) + 1)}
        return sorted(float(x) for x in values)


@dataclass(frozen=True)
class SearchSpace:
    params: tuple[Param, ...] = field(default_factory=tuple)

    def __len__(self) -> int:
        return len(self.params)

    def sample(self, chooser: Chooser, prefix: str = "") -> dict[str, Any]:
        """Walk the space once, asking ``chooser`` for each raw value."""
        out: dict[str, Any] = {}
        for p in self.params:
            key = prefix + p.name
            if p.type == "choice":
                index = chooser.categorical(key, len(p.values))
                option = p.values[index]
                if isinstance(option, Option):
                    out[p.name] = {"_name": option.name, **option.space.sample(chooser, f"{key}/{option.name}/")}
                else:
                    out[p.name] = option
            elif p.type == "randint":
                out[p.name] = chooser.integer(key, int(p.values[0]), int(p.values[1]) - 1)
            else:
                out[p.name] = p.decode_unit(chooser.unit(key))
        return out

    def encode(self, params: dict[str, Any], prefix: str = "") -> dict[str, Any]:
        """Raw values that reproduce ``params`` (imported or hand-written trials); inverse of sample()."""
        raw: dict[str, Any] = {}
        for p in self.params:
            if p.name not in params:
                raise SearchSpaceError(f'parameter "{prefix + p.name}" is missing')
            key, value = prefix + p.name, params[p.name]
            if p.type == "choice":
                names = [o.name if isinstance(o, Option) else o for o in p.values]
                nested = any(isinstance(o, Option) for o in p.values)
                chosen = value.get("_name") if nested and isinstance(value, dict) else value
                if chosen not in names:
                    raise SearchSpaceError(f'parameter "{key}": {chosen!r} is not one of {names}')
                raw[key] = index = names.index(chosen)
                option = p.values[index]
                if isinstance(option, Option):
                    sub = {k: v for k, v in value.items() if k != "_name"}
                    raw.update(option.space.encode(sub, f"{key}/{option.name}/"))
            elif p.type == "randint":
                raw[key] = int(value)
            else:
                raw[key] = p.encode_value(float(value))
        return raw

    def walk(self, prefix: str = "") -> Iterator[tuple[str, Param]]:
        """Every (key, param) of the space, nested options included."""
        for p in self.params:
            key = prefix + p.name
            yield key, p
            if p.type == "choice":
                for option in p.values:
                    if isinstance(option, Option):
                        yield from option.space.walk(f"{key}/{option.name}/")


def parse_search_space(raw: Any, where: str = "") -> SearchSpace:
    """Validate an NNI search-space dict (NNI's rules) and build its model."""
    if not isinstance(raw, dict):
        raise SearchSpaceError(f"search space{where and ' ' + where} must be a JSON object of "
                               f"{{name: {{_type, _value}}}}, got {type(raw).__name__}")
    params = []
    for name, spec in raw.items():
        label = f"{where}{name}"
        if not isinstance(spec, dict) or "_type" not in spec or "_value" not in spec:
            raise SearchSpaceError(f'parameter "{label}": must be an object with "_type" and "_value"')
        kind, values = spec["_type"], spec["_value"]
        if kind not in TYPES:
            raise SearchSpaceError(f'parameter "{label}": unknown _type {kind!r}; allowed: {", ".join(TYPES)}')
        if not isinstance(values, list):
            raise SearchSpaceError(f'parameter "{label}": _value must be a list, got {type(values).__name__}')
        extra = set(spec) - {"_type", "_value"}
        if extra:
            raise SearchSpaceError(f'parameter "{label}": unknown keys {sorted(extra)}; only _type and _value')
        params.append(Param(str(name), kind, tuple(_check_values(label, kind, values))))
    return SearchSpace(tuple(params))


def _check_values(label: str, kind: str, values: list[Any]) -> list[Any]:
    if kind == "choice":
        return _check_choice(label, values)
    need = 3 if kind in _Q_TYPES else 2
    if len(values) != need:
        raise SearchSpaceError(f'parameter "{label}": {kind} needs {need} values in _value, got {len(values)}')
    if any(isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x) for x in values):
        raise SearchSpaceError(f'parameter "{label}": {kind} values must be finite numbers, got {values}')
    if kind == "randint":
        if any(not float(x).is_integer() for x in values):
            raise SearchSpaceError(f'parameter "{label}": randint bounds must be integers, got {values}')
        values = [int(x) for x in values]
    if kind in _NORMAL_TYPES:
        if values[1] <= 0:
            raise SearchSpaceError(f'parameter "{label}": {kind} needs sigma > 0, got {values[1]}')
    elif values[0] >= values[1]:
        raise SearchSpaceError(f'parameter "{label}": {kind} needs low < high, got {values[0]} >= {values[1]}')
    if kind in ("loguniform", "qloguniform") and values[0] <= 0:
        raise SearchSpaceError(f'parameter "{label}": {kind} needs low > 0, got {values[0]}')
    if kind in _Q_TYPES and values[2] <= 0:
        raise SearchSpaceError(f'parameter "{label}": {kind} needs q > 0, got {values[2]}')
    return values


def _check_choice(label: str, values: list[Any]) -> list[Any]:
    if not values:
        raise SearchSpaceError(f'parameter "{label}": choice needs at least one option')
    if not any(isinstance(x, dict) and "_name" in x for x in values):
        return values  # plain values: any JSON value, dicts without "_name" included (NNI's BatchTuner)
    options = []
    for x in values:
        if not isinstance(x, dict) or "_name" not in x:
            raise SearchSpaceError(f'parameter "{label}": every nested choice option needs "_name", got {x!r}')
        sub = {k: v for k, v in x.items() if k != "_name"}
        options.append(Option(x["_name"], parse_search_space(sub, f"{label}/{x['_name']}/")))
    names = [o.name for o in options]
    if len(set(map(str, names))) != len(names):
        raise SearchSpaceError(f'parameter "{label}": nested choice option names must be unique, got {names}')
    return options


# ---- deterministic grids (GridSearch, Batch) -----------------------------------------------


def _level_units(level: int) -> list[float]:
    """Unit values first seen at refinement level ``level``: 1/2; 1/4, 3/4; 1/8, 3/8, ..."""
    return [(2 * i + 1) / 2 ** (level + 1) for i in range(2**level)]


def _points(space: SearchSpace, max_level: int, prefix: str = "") -> Iterator[dict[str, Any]]:
    """The grid up to ``max_level`` in NNI's order (the first parameter varies slowest), one point at a
    time: a fine grid over several parameters is far too large to hold."""
    units = sorted(u for lvl in range(max_level + 1) for u in _level_units(lvl))

    def choices(p: Param) -> Iterator[dict[str, Any]]:
        key = prefix + p.name
        if p.type == "choice":
            for i, option in enumerate(p.values):
                if isinstance(option, Option):
                    yield from ({key: i, **sub} for sub in _points(option.space, max_level, f"{key}/{option.name}/"))
                else:
                    yield {key: i}
        elif p.type == "randint":
            yield from ({key: i} for i in range(int(p.values[0]), int(p.values[1])))
        elif p.is_finite_q:
            yield from ({key: p.unit_of(g)} for g in p.grid_values())
        else:
            yield from ({key: u} for u in units)

    def from_param(index: int) -> Iterator[dict[str, Any]]:
        if index == len(space.params):
            yield {}
            return
        for head in choices(space.params[index]):
            for tail in from_param(index + 1):
                yield {**head, **tail}

    return from_param(0)


def grid_points(space: SearchSpace, max_points: int = 1_000_000) -> Iterator[dict[str, Any]]:
    """NNI GridSearch order: the finite grid with continuous types at their midpoint, then each
    refinement level's new points. Ends after the finite grid when no type is continuous."""
    has_continuous = any(p.is_continuous for _, p in space.walk())
    seen: set[tuple[tuple[str, Any], ...]] = set()
    level = 0
    while True:
        for pt in _points(space, level):
            key = tuple(sorted(pt.items()))
            if key in seen:
                continue
            seen.add(key)
            if len(seen) > max_points:
                return
            yield pt
        if not has_continuous:
            return
        level += 1


class ReplayChooser:
    """Replays stored raw values (grid points, resumed trials)."""

    def __init__(self, raw: dict[str, Any]) -> None:
        self.raw = raw

    def categorical(self, key: str, n: int) -> int:
        return int(self.raw[key])

    def integer(self, key: str, low: int, high: int) -> int:
        return int(self.raw[key])

    def unit(self, key: str) -> float:
        return float(self.raw[key])
