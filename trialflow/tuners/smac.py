"""SMAC (NNI's ``SMAC`` tuner) on SMAC3 (the ``smac`` extra): its hyperparameter-optimization facade
-- a random forest over the results and expected improvement, searched locally around the best
configurations and at random -- asked and told one trial at a time.

The space SMAC sees is the internal one: a choice is a categorical of option indices, a randint an
integer, every continuous type a float in [0, 1] decoded with NNI's formulas; keys of nested options a
configuration does not choose are ignored. A failed trial is told as the worst cost seen so far, so
SMAC avoids its region without an infinite cost in the forest. ``config_dedup`` (NNI's flag) is
accepted: SMAC3 never hands out a configuration twice in a deterministic scenario anyway.

Given several ``objectives``, SMAC3 is told one cost per objective (lower is better: a maximized one
negated) and combines them with its ParEGO algorithm, a new random weighting at each step. SMAC3 has no
constraints: an infeasible result is told as the worst cost seen so far in every objective, as a failed
trial is.

SMAC3 writes its run history to a temporary folder, removed when the tuner is dropped. A ``seed``
repeats SMAC's suggestions only under a fixed ``PYTHONHASHSEED``: SMAC3 and ConfigSpace iterate sets
of parameter names, whose order follows Python's per-process string hash.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from typing import Any

from ..records.search_space import SearchSpace
from .base import PreferringChooser, Suggestion, Tuner, TunerError
from .objectives import MultiResult, Objectives

N_TRIALS = 10**9  # the experiment decides when to stop, not SMAC


def _smac() -> Any:
    try:
        import ConfigSpace
        import smac
    except ImportError:
        raise TunerError("the SMAC tuner needs SMAC3: pip install 'trialflow[smac]'") from None
    return smac, ConfigSpace


class SmacTuner(Tuner):
    def __init__(self, space: SearchSpace, optimize_mode: str = "maximize", config_dedup: bool = False,
                 seed: int | None = None, objectives: Objectives | None = None) -> None:
        smac, cs = _smac()
        super().__init__(space, optimize_mode, seed)
        self.objectives = objectives
        self.config_space = cs.ConfigurationSpace(seed=seed)
        for key, p in space.walk():
            if p.type == "choice":
                self.config_space.add(cs.Categorical(key, list(range(len(p.values)))))
            elif p.type == "randint":
                self.config_space.add(cs.Integer(key, (int(p.values[0]), int(p.values[1]) - 1)))
            else:
                self.config_space.add(cs.Float(key, (0.0, 1.0)))
        folder = tempfile.mkdtemp(prefix="trialflow-smac-")
        weakref.finalize(self, shutil.rmtree, folder, True)
        scenario = smac.Scenario(self.config_space, deterministic=True, n_trials=N_TRIALS,
                                 output_directory=folder, seed=seed if seed is not None else -1,
                                 objectives=objectives.names if objectives is not None else "cost")
        several = None
        if objectives is not None:
            from smac.multi_objective.parego import ParEGO

            several = ParEGO(scenario, seed=seed)
        self.smac = smac.HyperparameterOptimizationFacade(scenario, _never_called, overwrite=True, logging_level=40,
                                                          multi_objective_algorithm=several)
        self._asked: dict[int, Any] = {}
        self._worst: list[float] | None = None  # per objective, of the results told so far

    def suggest(self) -> Suggestion:
        info = self.smac.ask()
        chooser = PreferringChooser(self.rng, dict(info.config))
        params = self.space.sample(chooser)
        pid = self._new_id()
        self._asked[pid] = info
        return Suggestion(pid, params, chooser.raw)

    def observe(self, parameter_id: int, value: float | MultiResult | None) -> None:  # type: ignore[override]
        info = self._asked.pop(parameter_id, None)
        if info is not None:
            self._tell(info, value)

    def _tell(self, info: Any, value: float | MultiResult | None) -> None:
        from smac.runhistory.dataclasses import TrialValue

        costs = self._costs(value)
        if costs is None:
            costs = self._worst if self._worst is not None else \
                [0.0] * (len(self.objectives.objectives) if self.objectives is not None else 1)
        else:
            self._worst = costs if self._worst is None else [max(w, c) for w, c in zip(self._worst, costs,
                                                                                          strict=True)]
        self.smac.tell(info, TrialValue(cost=costs if self.objectives is not None else costs[0]))

    def _costs(self, value: float | MultiResult | None) -> list[float] | None:
        """What SMAC is told of a usable result (lower is better); None for a failed or infeasible one."""
        if value is None:
            return None
        if isinstance(value, MultiResult):
            assert self.objectives is not None  # several values come only to a tuner made for them
            return list(self.objectives.minimised(value.values)) if value.feasible else None
        return [self.score(value)]

    def _replay(self, parameter_id: int, raw: dict[str, Any],  # type: ignore[override]
                value: float | MultiResult | None) -> None:
        from ConfigSpace import Configuration
        from smac.runhistory.dataclasses import TrialInfo

        values = {name: raw.get(name, hp.default_value) for name, hp in self.config_space.items()}
        config = Configuration(self.config_space, values=values, allow_inactive_with_values=True)
        self._tell(TrialInfo(config, seed=0), value)


def _never_called(config: Any, seed: int = 0) -> float:
    raise TunerError("SMAC's target function is not used: trials run on the platform")
