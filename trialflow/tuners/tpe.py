"""TPE's settings: NNI's ``tpe_args`` (and Optuna's own ``TPESampler`` arguments) checked when a config is
read and turned into Optuna's sampler when the tuner is built, and the history window that keeps a
suggestion's cost flat as an experiment's history grows.

NNI's keys keep NNI's meaning: ``n_startup_jobs`` random suggestions first, ``n_ei_candidates`` samples per
suggestion, ``prior_weight`` the search space's weight as one good trial, ``gamma`` and ``linear_forgetting``
together NNI's split (the best ``min(ceil(gamma * sqrt(n)), linear_forgetting)`` of ``n`` trials are the
good ones; trials older than the last ``linear_forgetting`` weigh less, linearly), ``constant_liar_type``
Optuna's constant liar for any type but ``null`` (running trials count among the bad ones: NNI's ``worst``;
Optuna has no ``best`` or ``mean`` liar). A key not given keeps Optuna's default, except that ``gamma`` and
``linear_forgetting`` default to NNI's 0.25 and 25 when the other is given. ``history_window`` (trialflow's):
the finished trials past which the history is cut to its best and most recent ones (0: never).
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import TYPE_CHECKING, Any

from .base import bool_arg, positive_number_arg

if TYPE_CHECKING:
    import numpy as np
    import optuna

# Optuna's TPE keeps below this many good trials by default (its gamma's cap)
OPTUNA_BELOW_CAP = 25
# the finished trials a TPE study holds at most: past it, a new one holds the best and the most recent
# HISTORY_WINDOW // 2 (benchmarks/tpe_history.py measures the cost and the search quality)
HISTORY_WINDOW = 1000

_LIARS = ("best", "worst", "mean")


def _count(minimum: int) -> Any:
    def check(value: Any) -> str | None:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= minimum
        return None if ok else f"must be an integer of at least {minimum}"
    return check


def _non_negative(value: Any) -> str | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value >= 0
    return None if ok else "must be a number of at least 0"


def _window(value: Any) -> str | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and (value == 0 or value >= 100)
    return None if ok else "must be 0 (the whole history) or an integer of at least 100"


def _liar(value: Any) -> str | None:
    return None if value is None or value in _LIARS else "must be best, worst, mean or null"


# NNI's TpeArguments -> the Optuna argument it sets (None: handled apart)
_NNI_KEYS: dict[str, tuple[Any, str | None]] = {
    "constant_liar_type": (_liar, None), "n_startup_jobs": (_count(0), "n_startup_trials"),
    "n_ei_candidates": (_count(1), "n_ei_candidates"), "linear_forgetting": (_count(0), None),
    "prior_weight": (_non_negative, "prior_weight"), "gamma": (positive_number_arg, None)}
# Optuna's own TPESampler arguments that a config can spell (its callables cannot be), and trialflow's window
_OPTUNA_KEYS: dict[str, Any] = {"history_window": _window,
    "n_startup_trials": _count(0), "multivariate": bool_arg, "group": bool_arg, "constant_liar": bool_arg,
    "consider_prior": bool_arg, "consider_magic_clip": bool_arg, "consider_endpoints": bool_arg,
    "warn_independent_sampling": bool_arg}


def check_tpe_args(value: Any) -> str | None:
    """The problem with a TPE tuner's ``tpe_args`` classArg, in words, or None when it is usable."""
    if not isinstance(value, dict):
        return "must be a mapping of NNI's TPE arguments"
    allowed = {**{k: check for k, (check, _) in _NNI_KEYS.items()}, **_OPTUNA_KEYS}
    for key, item in value.items():
        if key not in allowed:
            return f"has unknown key {key!r}; allowed: {', '.join(allowed)}"
        problem = allowed[key](item)
        if problem:
            return f"key {key!r} {problem}"
    return None


def nni_gamma(gamma: float, forgetting: int, n: int) -> int:
    """NNI's count of good trials among ``n``: ``min(ceil(gamma * sqrt(n)), forgetting)``."""
    return min(math.ceil(gamma * math.sqrt(n)), forgetting)


def nni_weights(forgetting: int, n: int) -> np.ndarray:
    """NNI's linear forgetting: weight 1 for the last ``forgetting`` of ``n`` trials, older ones less, down to 1/n."""
    import numpy as np

    if n < forgetting or n == 0:
        return np.ones(n)
    return np.concatenate([np.linspace(1.0 / n, 1.0, n - forgetting), np.ones(forgetting)])


class TpeSettings:
    """A TPE tuner's settings from its checked ``tpe_args``; immutable once made."""

    def __init__(self, tpe_args: dict[str, Any] | None = None) -> None:
        args = dict(tpe_args or {})
        self.sampler_args: dict[str, Any] = {}
        for key, (_, optuna_key) in _NNI_KEYS.items():
            if key in args and optuna_key is not None:
                self.sampler_args[optuna_key] = args.pop(key)
        if self.sampler_args.get("prior_weight") == 0:  # NNI's "no prior"; Optuna's weight 0 logs log(0) warnings
            del self.sampler_args["prior_weight"]
            self.sampler_args["consider_prior"] = False
        if "constant_liar_type" in args:
            self.sampler_args["constant_liar"] = args.pop("constant_liar_type") is not None
        self.window_size = int(args.pop("history_window", HISTORY_WINDOW))
        self.nni_split: tuple[float, int] | None = None
        if "gamma" in args or "linear_forgetting" in args:
            self.nni_split = (float(args.pop("gamma", 0.25)), int(args.pop("linear_forgetting", 25)))
            self.sampler_args["gamma"] = functools.partial(nni_gamma, *self.nni_split)
            self.sampler_args["weights"] = functools.partial(nni_weights, self.nni_split[1])
        self.sampler_args.update(args)

    def sampler(self, seed: int | None) -> optuna.samplers.TPESampler:
        import optuna

        with warnings.catch_warnings():  # Optuna 5 marks gamma, weights, prior_weight... for removal in 6
            warnings.simplefilter("ignore", FutureWarning)
            return optuna.samplers.TPESampler(seed=seed, **self.sampler_args)

    def history_window(self) -> tuple[int, int] | None:
        """(most finished trials a study keeps, how many of the best are always among them; see
        :class:`~trialflow.tuners.optuna_tuners.OptunaTuner`), or None for the whole history
        (``history_window: 0``)."""
        if self.window_size == 0:
            return None
        best = OPTUNA_BELOW_CAP if self.nni_split is None else self.nni_split[1]
        return self.window_size, min(max(best, OPTUNA_BELOW_CAP), self.window_size // 4)
