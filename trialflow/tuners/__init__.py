"""Built-in tuners under NNI's names, with NNI's defaults and ``classArgs`` validation.

Names are case-insensitive. Optuna samplers back TPE, Random, CMA-ES and GP; GridSearch, Batch,
Anneal and Evolution walk the same internal space themselves (Optuna has no sampler with their
semantics that handles nested choices).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Protocol

from ..search_space import SearchSpace, parse_search_space
from .anneal import AnnealTuner
from .base import (
    InvalidMetric,
    Suggestion,
    Tuner,
    TunerError,
    check_args,
    dict_arg,
    extract_scalar,
    number_arg,
    optimize_mode_arg,
    positive_int_arg,
    scalar_or_none,
    seed_arg,
)
from .custom import NniTuner, check_algorithm, is_custom, load_custom
from .evolution import EvolutionTuner
from .grid import BatchTuner, GridSearchTuner
from .optuna_tuners import OptunaTuner, cmaes_sampler, gp_sampler, random_sampler, tpe_sampler


class AlgorithmSpec(Protocol):
    """What a tuner or assessor section of the config holds (``trialflow.config.AlgorithmConfig``)."""

    name: str | None
    class_name: str | None
    class_args: dict[str, Any]
    code_directory: Any

__all__ = ["InvalidMetric", "Suggestion", "Tuner", "TunerError", "create_tuner", "extract_scalar",
           "scalar_or_none", "TUNERS", "check_tuner", "NNI_ONLY_TUNERS"]

KNOWN_TUNERS = "TPE, Random, Anneal, Evolution, GridSearch, Batch, CMAES, GP"
# NNI's built-in tuners and advisors (its registered_algorithms.yml) that trialflow does not have
NNI_ONLY_TUNERS = ("SMAC", "MetisTuner", "PBTTuner", "PPOTuner", "NetworkMorphism", "RegularizedEvolutionTuner",
                   "DNGOTuner", "Hyperband", "BOHB")
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


# built-in tuners that need an optional package: name -> (module, what it is, the extra that installs it)
NEEDS = {"gp": ("torch", "PyTorch", "gp"), "gptuner": ("torch", "PyTorch", "gp")}


def check_tuner(config: AlgorithmSpec) -> None:
    """What NNI checks at ``nnictl create``, before anything is written: the tuner's name, its
    ``classArgs`` (a customized one's through its ``classArgsValidator``; its class is loaded) and, for
    a built-in, the optional package it needs. Nothing is built. Raises :class:`TunerError`."""
    name = check_algorithm(config, "tuner", TUNERS, KNOWN_TUNERS)
    if name in NEEDS:
        module, what, extra = NEEDS[name]
        try:
            importlib.import_module(module)
        except ImportError:
            raise TunerError(f"the {config.name} tuner needs {what}: pip install 'trialflow[{extra}]'") from None


def create_tuner(config: AlgorithmSpec, search_space: Any) -> Tuner:
    """Build the configured tuner over ``search_space`` (as written in the config); unknown names
    and bad ``classArgs`` raise :class:`TunerError`."""
    if is_custom(config, TUNERS):
        return _custom_tuner(config, search_space)
    name = (config.name or "").lower()
    if name not in TUNERS:
        raise TunerError(f"unknown tuner {config.name!r}; built-in: {KNOWN_TUNERS}")
    factory, allowed = TUNERS[name]
    args = check_args(f"tuner {config.name}", config.class_args, allowed)
    return factory(_parsed(search_space), **args)


def _parsed(search_space: Any) -> SearchSpace:
    return search_space if isinstance(search_space, SearchSpace) else parse_search_space(search_space)


def _custom_tuner(config: AlgorithmSpec, search_space: Any) -> Tuner:
    """A customized tuner: a trialflow :class:`Tuner` subclass is called with the parsed search
    space and ``classArgs``; any other class (NNI's ``nni.tuner.Tuner`` API) is built with
    ``classArgs`` and gets the search space as written, unvalidated, as NNI hands it to customized
    tuners."""
    custom = load_custom(config, "tuner")
    if issubclass(custom.cls, Tuner):
        return custom.cls(_parsed(search_space), **custom.class_args)  # type: ignore[no-any-return]
    if not any(callable(getattr(custom.cls, m, None)) for m in ("generate_parameters", "generate_multiple_parameters")):
        raise TunerError(f"{custom.label}: {custom.cls.__name__} is not a tuner: subclass nni.tuner.Tuner and "
                         "implement generate_parameters and receive_trial_result")
    return NniTuner(custom.instantiate(), search_space, custom.label)
