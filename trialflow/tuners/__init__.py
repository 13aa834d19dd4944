"""Built-in tuners under NNI's names, with NNI's defaults and ``classArgs`` validation.

Names are case-insensitive. Optuna samplers back TPE, Random and CMA-ES; GridSearch, Batch,
Anneal and Evolution walk the same internal space themselves (Optuna has no sampler with their
semantics that handles nested choices). Hyperband, BOHB (statsmodels' KDE) and PBT pass budgets and
checkpoint folders to trials as NNI's do; SMAC runs on SMAC3, Metis, DNGO and GP on scikit-learn. NNI's
NAS-only tuners are refused.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ..records.search_space import SearchSpace, parse_search_space
from .base import (
    InvalidMetric,
    Suggestion,
    Tuner,
    TunerError,
    bool_arg,
    check_args,
    extract_scalar,
    number_arg,
    optimize_mode_arg,
    positive_int_arg,
    positive_number_arg,
    scalar_or_none,
    seed_arg,
)
from .custom import Checkpoint, NniTuner, check_algorithm, is_custom, load_custom
from .tpe import check_tpe_args

if TYPE_CHECKING:
    from .objectives import Objectives


class AlgorithmSpec(Protocol):
    """What a tuner or assessor section of the config holds (``trialflow.config.AlgorithmConfig``)."""

    name: str | None
    class_name: str | None
    class_args: dict[str, Any]
    code_directory: Any

__all__ = ["InvalidMetric", "Suggestion", "Tuner", "TunerError", "create_tuner", "extract_scalar",
           "scalar_or_none", "TUNERS", "check_tuner", "NAS_TUNERS", "MULTI_OBJECTIVE_TUNERS",
           "MULTI_OBJECTIVE_NAMES"]

KNOWN_TUNERS = ("TPE, Random, Anneal, Evolution, GridSearch, Batch, CMAES, GP, Hyperband, BOHB, PBT, SMAC, Metis, "
                "DNGO, NSGA2, NSGA3")
# NNI's built-in tuners for neural architecture search: out of scope
NAS_TUNERS = ("PPOTuner", "PPO", "NetworkMorphism", "RegularizedEvolutionTuner")
_MODE_SEED: dict[str, Callable[[Any], str | None]] = {"optimize_mode": optimize_mode_arg, "seed": seed_arg}


GP_UTILITIES = ("ei", "ucb", "poi")  # GpTuner's acquisition functions


def _tuner_class(module: str, name: str) -> Callable[..., Tuner]:
    """Tuner class ``name`` of submodule ``module``, imported when a tuner is built: naming and checking
    tuners (the CLI's read-only commands, ``create``'s checks) loads no numerical library."""
    def factory(*args: Any, **kwargs: Any) -> Tuner:
        cls: Callable[..., Tuner] = getattr(importlib.import_module(f"{__name__}.{module}"), name)
        return cls(*args, **kwargs)
    factory.__qualname__ = factory.__name__ = name
    return factory


def _tpe(space: SearchSpace, optimize_mode: str = "minimize", seed: int | None = None,
         tpe_args: dict[str, Any] | None = None, objectives: Objectives | None = None) -> Tuner:
    from .optuna_tuners import OptunaTuner
    from .tpe import TpeSettings

    settings = TpeSettings(tpe_args)
    return OptunaTuner(space, settings.sampler, optimize_mode, seed, objectives, settings.history_window())


def _random(space: SearchSpace, optimize_mode: str = "minimize", seed: int | None = None,
            objectives: Objectives | None = None) -> Tuner:
    from .optuna_tuners import OptunaTuner, random_sampler

    return OptunaTuner(space, random_sampler, optimize_mode, seed, objectives)


def _nsga(version: int) -> Callable[..., Tuner]:
    def factory(space: SearchSpace, optimize_mode: str = "minimize", seed: int | None = None,
                population_size: int | None = None, objectives: Objectives | None = None) -> Tuner:
        from .optuna_tuners import OptunaTuner, nsga_sampler

        return OptunaTuner(space, lambda s: nsga_sampler(version, s, population_size), optimize_mode, seed,
                           objectives)
    return factory


def _cmaes(space: SearchSpace, optimize_mode: str = "minimize", seed: int | None = None) -> Tuner:
    from .optuna_tuners import OptunaTuner, cmaes_sampler

    return OptunaTuner(space, cmaes_sampler, optimize_mode, seed)


AnnealTuner = _tuner_class("anneal", "AnnealTuner")
EvolutionTuner = _tuner_class("evolution", "EvolutionTuner")
GridSearchTuner = _tuner_class("grid", "GridSearchTuner")
BatchTuner = _tuner_class("grid", "BatchTuner")
GpTuner = _tuner_class("model_based", "GpTuner")
MetisTuner = _tuner_class("model_based", "MetisTuner")
DngoTuner = _tuner_class("model_based", "DngoTuner")
HyperbandTuner = _tuner_class("hyperband", "HyperbandTuner")
BohbTuner = _tuner_class("bohb", "BohbTuner")
PbtTuner = _tuner_class("pbt", "PbtTuner")
SmacTuner = _tuner_class("smac", "SmacTuner")


def _eta_arg(value: Any) -> str | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 2
    return None if ok else "must be an integer of at least 2"


def _exec_mode_arg(value: Any) -> str | None:
    return None if value in ("serial", "parallelism") else "must be 'serial' or 'parallelism'"


def _percent_arg(value: Any) -> str | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 99
    return None if ok else "must be an integer from 1 to 99"


def _fraction_arg(value: Any) -> str | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= 1
    return None if ok else "must be a number from 0 to 1"


def _pcs_arg(value: Any) -> str | None:
    return "(a ConfigSpace .pcs file) is not supported: write the search space in NNI's format instead"


def _utility_arg(value: Any) -> str | None:
    return None if value in GP_UTILITIES else f"must be one of {', '.join(GP_UTILITIES)}"


def _text_arg(value: Any) -> str | None:
    return None if isinstance(value, str) and value else "must be a folder path"


ArgChecks = dict[str, Callable[[Any], str | None]]  # classArgs name -> check (an error, or None)
_PBT_ARGS: ArgChecks = {**_MODE_SEED, "all_checkpoint_dir": _text_arg, "population_size": positive_int_arg,
             "factor": _fraction_arg, "resample_probability": _fraction_arg, "fraction": _fraction_arg}
_METIS_ARGS: ArgChecks = {**_MODE_SEED, "no_resampling": bool_arg, "no_candidates": bool_arg,
               "selection_num_starting_points": positive_int_arg, "cold_start_num": positive_int_arg,
               "exploration_probability": _fraction_arg}
_GP_ARGS: ArgChecks = {**_MODE_SEED, "utility": _utility_arg, "kappa": number_arg, "xi": number_arg,
                       "nu": positive_number_arg, "alpha": positive_number_arg,
                       "cold_start_num": positive_int_arg, "selection_num_warm_up": positive_int_arg,
                       "selection_num_starting_points": positive_int_arg}
_DNGO_ARGS: ArgChecks = {**_MODE_SEED, "sample_size": positive_int_arg, "trials_per_update": positive_int_arg,
              "num_epochs_per_training": positive_int_arg}
_NSGA_ARGS: ArgChecks = {**_MODE_SEED, "population_size": positive_int_arg}

# name -> (factory, allowed classArgs)
TUNERS: dict[str, tuple[Callable[..., Tuner], dict[str, Callable[[Any], str | None]]]] = {
    "tpe": (_tpe, {**_MODE_SEED, "tpe_args": check_tpe_args}),
    "random": (_random, dict(_MODE_SEED)),
    "anneal": (AnnealTuner, {**_MODE_SEED, "n_startup": positive_int_arg, "avg_best_idx": number_arg,
                             "shrink_coef": number_arg}),
    "evolution": (EvolutionTuner, {**_MODE_SEED, "population_size": positive_int_arg}),
    "gridsearch": (GridSearchTuner, {}),
    "batch": (BatchTuner, {}),
    "batchtuner": (BatchTuner, {}),
    "cmaes": (_cmaes, dict(_MODE_SEED)),
    "cma-es": (_cmaes, dict(_MODE_SEED)),
    "gp": (GpTuner, _GP_ARGS),
    "gptuner": (GpTuner, _GP_ARGS),
    "hyperband": (HyperbandTuner, {**_MODE_SEED, "R": positive_int_arg, "eta": _eta_arg, "exec_mode": _exec_mode_arg,
                                   "all_checkpoint_dir": _text_arg}),
    "bohb": (BohbTuner, {**_MODE_SEED, "min_budget": positive_int_arg, "max_budget": positive_int_arg,
                         "eta": _eta_arg, "min_points_in_model": positive_int_arg,
                         "top_n_percent": _percent_arg, "num_samples": positive_int_arg,
                         "random_fraction": _fraction_arg, "bandwidth_factor": number_arg,
                         "min_bandwidth": number_arg, "config_space": _pcs_arg, "all_checkpoint_dir": _text_arg}),
    "pbt": (PbtTuner, _PBT_ARGS),
    "pbttuner": (PbtTuner, _PBT_ARGS),
    "smac": (SmacTuner, {**_MODE_SEED, "config_dedup": bool_arg}),
    "metis": (MetisTuner, _METIS_ARGS),
    "metistuner": (MetisTuner, _METIS_ARGS),
    "dngo": (DngoTuner, _DNGO_ARGS),
    "dngotuner": (DngoTuner, _DNGO_ARGS),
    **{name: (_nsga(2), _NSGA_ARGS) for name in ("nsga2", "nsgaii", "nsga-ii")},
    **{name: (_nsga(3), _NSGA_ARGS) for name in ("nsga3", "nsgaiii", "nsga-iii")},
}
# the built-in tuners that take several objectives and constraints (``objectives`` in the config)
MULTI_OBJECTIVE_TUNERS = frozenset({"tpe", "random", "gridsearch", "gp", "gptuner", "smac", "nsga2", "nsgaii",
                                    "nsga-ii", "nsga3", "nsgaiii", "nsga-iii"})
MULTI_OBJECTIVE_NAMES = "TPE, Random, GridSearch, GPTuner, SMAC, NSGA2, NSGA3"


# each built-in tuner as NNI's ``nnictl algo list`` names it (keys: every spelling accepted)
NNI_NAMES = {"tpe": "TPE", "random": "Random", "anneal": "Anneal", "evolution": "Evolution",
             "gridsearch": "GridSearch", "batch": "BatchTuner", "batchtuner": "BatchTuner", "cmaes": "CMAES",
             "cma-es": "CMAES", "gp": "GPTuner", "gptuner": "GPTuner", "hyperband": "Hyperband", "bohb": "BOHB",
             "pbt": "PBTTuner", "pbttuner": "PBTTuner", "smac": "SMAC", "metis": "MetisTuner",
             "metistuner": "MetisTuner", "dngo": "DNGOTuner", "dngotuner": "DNGOTuner",
             **dict.fromkeys(("nsga2", "nsgaii", "nsga-ii"), "NSGA2"),
             **dict.fromkeys(("nsga3", "nsgaiii", "nsga-iii"), "NSGA3")}

# built-in tuners that need an optional package: name -> (module, what it is, the extra that installs it)
NEEDS = {"gp": ("sklearn", "scikit-learn", "gp"), "gptuner": ("sklearn", "scikit-learn", "gp"),
         "bohb": ("statsmodels", "statsmodels", "bohb"), "smac": ("smac", "SMAC3", "smac"),
         "metis": ("sklearn", "scikit-learn", "sklearn"), "metistuner": ("sklearn", "scikit-learn", "sklearn"),
         "dngo": ("sklearn", "scikit-learn", "sklearn"), "dngotuner": ("sklearn", "scikit-learn", "sklearn")}


def check_tuner(config: AlgorithmSpec) -> None:
    """What NNI checks at ``nnictl create``, before anything is written: the tuner's name, its
    ``classArgs`` (a customized one's through its ``classArgsValidator``; its class is loaded) and, for
    a built-in, the optional package it needs. Nothing is built. Raises :class:`TunerError`."""
    name = check_algorithm(config, "tuner", Tuner, TUNERS, KNOWN_TUNERS)
    if name in NEEDS:
        module, what, extra = NEEDS[name]
        try:
            importlib.import_module(module)
        except ImportError:
            raise TunerError(f"the {config.name} tuner needs {what}: pip install 'trialflow[{extra}]'") from None


def create_tuner(config: AlgorithmSpec, search_space: Any, objectives: Objectives | None = None,
                 checkpoint: Checkpoint | None = None) -> Tuner:
    """Build the configured tuner over ``search_space`` (as written in the config), for the experiment's
    ``objectives`` when it has several (a built-in of :data:`MULTI_OBJECTIVE_TUNERS`, or a customized
    tuner, which gets the final results as reported; an NNI-API one is bound to the experiment's
    ``checkpoint`` and loads it first when the run resumes); unknown names and bad ``classArgs`` raise
    :class:`TunerError`."""
    if is_custom(config, TUNERS):
        return _custom_tuner(config, search_space, checkpoint)
    name = (config.name or "").lower()
    if name not in TUNERS:
        raise TunerError(f"unknown tuner {config.name!r}; built-in: {KNOWN_TUNERS}")
    factory, allowed = TUNERS[name]
    args = check_args(f"tuner {config.name}", config.class_args, allowed)
    if objectives is not None:
        if name not in MULTI_OBJECTIVE_TUNERS:
            raise TunerError(f"tuner {config.name} cannot tune several objectives; use one of {MULTI_OBJECTIVE_NAMES}")
        args["objectives"] = objectives
    return factory(_parsed(search_space), **args)


def _parsed(search_space: Any) -> SearchSpace:
    return search_space if isinstance(search_space, SearchSpace) else parse_search_space(search_space)


def _custom_tuner(config: AlgorithmSpec, search_space: Any, checkpoint: Checkpoint | None) -> Tuner:
    """A customized tuner: a trialflow :class:`Tuner` subclass is called with the parsed search
    space and ``classArgs``; any other class (NNI's ``nni.tuner.Tuner`` API) is built with
    ``classArgs`` and gets the search space as written, unvalidated, as NNI hands it to customized
    tuners."""
    custom = load_custom(config, "tuner", Tuner)
    if issubclass(custom.cls, Tuner):
        return custom.cls(_parsed(search_space), **custom.class_args)  # type: ignore[no-any-return]
    return NniTuner(custom.instantiate(), search_space, custom.label, checkpoint)
