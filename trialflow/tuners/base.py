"""The tuner seam: what to try next. Tuners know nothing of trials' processes or platforms.

Lifecycle: ``suggest()`` hands out a :class:`Suggestion` (``None`` once the tuner has nothing more,
e.g. a finished grid); ``observe()`` reports its outcome (a float, or ``None`` for a failed or
invalid trial) exactly once; ``replay()`` feeds a finished trial of a resumed experiment.
Suggestions carry their raw internal values so a resumed tuner is rebuilt exactly.
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from ..foundation.user_errors import UserError
from ..records.search_space import SearchSpace

# the checkpoint folders PBT (and, when asked, Hyperband and BOHB) pass in a trial's parameters, NNI's names
LOAD_KEY, SAVE_KEY = "load_checkpoint_dir", "save_checkpoint_dir"


class TunerError(UserError, ValueError):
    """Bad tuner/assessor name or classArgs; the message names the argument and what is allowed."""


class InvalidMetric(ValueError):
    """A final metric that is neither a number nor a dict with a numeric ``default``."""


@dataclass(frozen=True)
class Suggestion:
    parameter_id: int
    parameters: dict[str, Any]
    raw: dict[str, Any]


def extract_scalar(value: Any) -> float:
    """NNI's reward rule: a finite number, or a dict whose ``default`` is a finite number."""
    if isinstance(value, dict):
        if "default" not in value:
            raise InvalidMetric(f"a dict metric needs a numeric 'default' key, got keys {sorted(value)[:10]}")
        value = value["default"]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidMetric(f"metric must be a number or a dict with a numeric 'default', got {type(value).__name__}")
    try:
        number = float(value)
    except OverflowError:  # an int beyond any float (10**400)
        raise InvalidMetric("metric is out of range (a float holds up to 1.8e308)") from None
    if not math.isfinite(number):
        raise InvalidMetric(f"metric must be finite, got {value}")
    return number


def scalar_or_none(value: Any) -> float | None:
    """:func:`extract_scalar`, or None for a missing or unusable metric."""
    if value is None:
        return None
    try:
        return extract_scalar(value)
    except InvalidMetric:
        return None


class Tuner(ABC):
    """Base class: keeps ids, direction and the outcome bookkeeping common to every tuner.

    ``failure`` is set (and stays set) when the tuner cannot go on; the experiment then ends ERROR
    with it as the message."""

    failure: str | None = None

    def __init__(self, space: SearchSpace, optimize_mode: str = "minimize", seed: int | None = None) -> None:
        self.space = space
        self.maximize = optimize_mode == "maximize"
        self.rng = random.Random(seed)
        self.seed = seed
        self._next_id = 0

    def _new_id(self) -> int:
        pid = self._next_id
        self._next_id += 1
        return pid

    def score(self, value: float) -> float:
        """Lower is better, whatever the optimize mode."""
        return -value if self.maximize else value

    @abstractmethod
    def suggest(self) -> Suggestion | None: ...

    def can_suggest(self) -> bool:
        """False while the tuner waits for running trials to end before it can suggest more (a
        Hyperband round, a PBT generation); the loop then asks again when a trial ends. Default: True
        (a tuner that has nothing more returns None from :meth:`suggest`)."""
        return True

    def intermediate_results(self, parameter_id: int, values: list[float]) -> None:  # noqa: B027 -- optional hook
        """The intermediate results a trial reported, told once before its end (default: unused)."""

    @abstractmethod
    def observe(self, parameter_id: int, value: float | None) -> None: ...

    def conclude(self, parameter_id: int, value: float | None, final: Any, succeeded: bool) -> None:
        """A trial ended: ``value`` is its usable result (None when it failed or its result was
        unusable), ``final`` the result as the trial reported it. Default: :meth:`observe`."""
        self.observe(parameter_id, value)

    def reserve(self, parameter_id: int) -> None:
        """Never hand out ``parameter_id`` again (it belongs to a trial taken over on resume)."""
        self._next_id = max(self._next_id, parameter_id + 1)

    def replay(self, parameter_id: int, raw: dict[str, Any], value: float | None) -> None:
        """Feed a trial finished before a resume; later ids continue after it."""
        self._next_id = max(self._next_id, parameter_id + 1)
        self._replay(parameter_id, raw, value)

    @abstractmethod
    def _replay(self, parameter_id: int, raw: dict[str, Any], value: float | None) -> None: ...


class RawHistoryTuner(Tuner):
    """A tuner that remembers each suggestion's raw values (Anneal, Evolution build on them)."""

    def __init__(self, space: SearchSpace, optimize_mode: str = "minimize", seed: int | None = None) -> None:
        super().__init__(space, optimize_mode, seed)
        self._raw: dict[int, dict[str, Any]] = {}

    def _emit(self, chooser: RecordingChooser) -> Suggestion:
        params = self.space.sample(chooser)
        pid = self._new_id()
        self._raw[pid] = chooser.raw
        return Suggestion(pid, params, chooser.raw)

    def _replay(self, parameter_id: int, raw: dict[str, Any], value: float | None) -> None:
        self._raw[parameter_id] = raw
        self.observe(parameter_id, value)


class RecordingChooser(ABC):
    """A chooser that draws raw values with ``draw_*`` (each tuner's own rule) and records them by key."""

    def __init__(self) -> None:
        self.raw: dict[str, Any] = {}

    def categorical(self, key: str, n: int) -> int:
        self.raw[key] = value = self.draw_categorical(key, n)
        return value

    def integer(self, key: str, low: int, high: int) -> int:
        self.raw[key] = value = self.draw_integer(key, low, high)
        return value

    def unit(self, key: str) -> float:
        self.raw[key] = value = self.draw_unit(key)
        return value

    @abstractmethod
    def draw_categorical(self, key: str, n: int) -> int:
        """An index in ``range(n)`` for the choice ``key``."""

    @abstractmethod
    def draw_integer(self, key: str, low: int, high: int) -> int:
        """An integer from ``low`` to ``high`` (both included) for ``key``."""

    @abstractmethod
    def draw_unit(self, key: str) -> float:
        """A float in [0, 1) for ``key``: the internal form of every continuous type."""


class RandomChooser(RecordingChooser):
    """Uniform draws in the internal space (exact prior sampling of every NNI type)."""

    def __init__(self, rng: random.Random) -> None:
        super().__init__()
        self.rng = rng

    def draw_categorical(self, key: str, n: int) -> int:
        return self.rng.randrange(n)

    def draw_integer(self, key: str, low: int, high: int) -> int:
        return self.rng.randint(low, high)

    def draw_unit(self, key: str) -> float:
        return self.rng.random()


class PreferringChooser(RandomChooser):
    """The raw values of ``preferred`` where it has the key, uniform draws elsewhere (a model's pick
    completed for the nested options it chose)."""

    def __init__(self, rng: random.Random, preferred: dict[str, Any]) -> None:
        super().__init__(rng)
        self.preferred = preferred

    def draw_categorical(self, key: str, n: int) -> int:
        return int(self.preferred[key]) if key in self.preferred else super().draw_categorical(key, n)

    def draw_integer(self, key: str, low: int, high: int) -> int:
        return int(self.preferred[key]) if key in self.preferred else super().draw_integer(key, low, high)

    def draw_unit(self, key: str) -> float:
        return float(self.preferred[key]) if key in self.preferred else super().draw_unit(key)


def check_args(algorithm: str, given: dict[str, Any], allowed: dict[str, Any]) -> dict[str, Any]:
    """Validate ``classArgs`` against ``allowed`` ({name: validator(value) -> error or None})."""
    out = {}
    for key, value in given.items():
        if key not in allowed:
            names = ", ".join(sorted(allowed)) or "none"
            raise TunerError(f"{algorithm}: unknown classArgs key {key!r}; allowed: {names}")
        problem = allowed[key](value)
        if problem:
            raise TunerError(f"{algorithm}: classArgs.{key} {problem} (got {value!r})")
        out[key] = value
    return out


def optimize_mode_arg(value: Any) -> str | None:
    return None if value in ("minimize", "maximize") else "must be 'minimize' or 'maximize'"


def seed_arg(value: Any) -> str | None:
    return None if isinstance(value, int) and not isinstance(value, bool) else "must be an integer"


def positive_int_arg(value: Any) -> str | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    return None if ok else "must be a positive integer"


def number_arg(value: Any) -> str | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return None if ok else "must be a number"


def positive_number_arg(value: Any) -> str | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value > 0
    return None if ok else "must be a positive number"


def bool_arg(value: Any) -> str | None:
    return None if isinstance(value, bool) else "must be true or false"
