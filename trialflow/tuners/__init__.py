"""Built-in tuners under NNI's names, with NNI's defaults and ``classArgs`` validation.

Names are case-insensitive. Optuna samplers back TPE, Random, CMA-ES and GP; GridSearch, Batch,
Anneal and Evolution walk the same internal space themselves (Optuna has no sampler with their
semantics that handles nested choices).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any, Protocol

from ..search_space import SearchSpace
from .anneal import AnnealTuner
from .base import (
    InvalidMetric,
    Suggestion,
    Tuner,
    TunerError,
    check_args,
    dict_arg,
    extract_scalar,
    maximizes,
    number_arg,
    optimize_mode_arg,
    positive_int_arg,
    scalar_or_none,
    seed_arg,
)
from .evolution import EvolutionTuner
from .grid import BatchTuner, GridSearchTuner
from .optuna_tuners import OptunaTuner, cmaes_sampler, gp_sampler, random_sampler, tpe_sampler


class AlgorithmSpec(Protocol):
    """What a tuner or assessor section of the config holds (``trialflow.config.AlgorithmConfig``)."""

    name: str | None
    class_name: str | None
    class_args: dict[str, Any]
    code_directory: Any

__all__ = ["InvalidMetric", "Suggestion", "Tuner", "TunerError", "create_tuner", "extract_scalar", "maximizes",
           "scalar_or_none", "TUNERS"]

_MODE_SEED = {"optimize_mode": optimize_mode_arg, "seed": seed_arg}


def _tpe(space: SearchSpace, optimize_mode: str = "minimize", seed: int | None = None,
         tpe_args: dict[str, Any] | None = None) -> Tuner:
    return OptunaTuner(space, tpe_sampler(seed, tpe_args), optimize_mode, seed)


def _random(space: SearchSpace, optimize_mode: str = "minimize", seed: int | None = None) -> Tuner:
    return OptunaTuner(space, random_sampler(seed), optimize_mode, seed)


def _cmaes(space: SearchSpace, optimize_mode: str = "minimize", seed: int | None = None) -> Tuner:
    return OptunaTuner(space, cmaes_sampler(seed), optimize_mode, seed)


def _gp(space: SearchSpace, optimize_mode: str = "minimize", seed: int | None = None) -> Tuner:
    return OptunaTuner(space, gp_sampler(seed), optimize_mode, seed)


# name -> (factory, allowed classArgs)
TUNERS: dict[str, tuple[Callable[..., Tuner], dict[str, Callable[[Any], str | None]]]] = {
    "tpe": (_tpe, {**_MODE_SEED, "tpe_args": dict_arg}),
    "random": (_random, dict(_MODE_SEED)),
    "anneal": (AnnealTuner, {**_MODE_SEED, "n_startup": positive_int_arg, "avg_best_idx": number_arg,
                             "shrink_coef": number_arg}),
    "evolution": (EvolutionTuner, {**_MODE_SEED, "population_size": positive_int_arg}),
    "gridsearch": (GridSearchTuner, {}),
    "batch": (BatchTuner, {}),
    "batchtuner": (BatchTuner, {}),
    "cmaes": (_cmaes, dict(_MODE_SEED)),
    "cma-es": (_cmaes, dict(_MODE_SEED)),
    "gp": (_gp, dict(_MODE_SEED)),
    "gptuner": (_gp, dict(_MODE_SEED)),
}


def create_tuner(config: AlgorithmSpec, space: SearchSpace) -> Tuner:
    """Build the configured tuner; unknown names and bad ``classArgs`` raise :class:`TunerError`."""
    if config.class_name:
        return _custom_tuner(config, space)
    name = (config.name or "").lower()
    if name not in TUNERS:
        known = "TPE, Random, Anneal, Evolution, GridSearch, Batch, CMAES, GP"
        raise TunerError(f"unknown tuner {config.name!r}; built-in tuners: {known}")
    factory, allowed = TUNERS[name]
    args = check_args(f"tuner {config.name}", config.class_args, allowed)
    return factory(space, **args)


def _custom_tuner(config: AlgorithmSpec, space: SearchSpace) -> Tuner:
    """``className: module.Class`` from ``codeDirectory``: a trialflow Tuner subclass, called with
    the search space and ``classArgs``."""
    module_name, _, cls_name = (config.class_name or "").rpartition(".")
    if not module_name:
        raise TunerError(f"className {config.class_name!r} must be 'module.ClassName'")
    if config.code_directory is not None and str(config.code_directory) not in sys.path:
        sys.path.insert(0, str(config.code_directory))
    try:
        cls = getattr(importlib.import_module(module_name), cls_name)
    except (ImportError, AttributeError) as exc:
        raise TunerError(f"cannot load tuner class {config.class_name!r}: {exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, Tuner)):
        raise TunerError(f"{config.class_name} must subclass trialflow.tuners.Tuner")
    return cls(space, **config.class_args)
