"""SMAC (NNI's ``SMAC`` tuner) on SMAC3 (the ``smac`` extra): its hyperparameter-optimization facade
-- a random forest over the results and expected improvement, searched locally around the best
configurations and at random -- asked and told one trial at a time.

The space SMAC sees is the internal one: a choice is a categorical of option indices, a randint an
integer, every continuous type a float in [0, 1] decoded with NNI's formulas; keys of nested options a
configuration does not choose are ignored. A failed trial is told as the worst cost seen so far, so
SMAC avoids its region without an infinite cost in the forest. ``config_dedup`` (NNI's flag) is
accepted: SMAC3 never hands out a configuration twice in a deterministic scenario anyway.

SMAC3 writes its run history to a temporary folder, removed when the tuner is dropped.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from typing import Any

from ..search_space import SearchSpace
from .base import PreferringChooser, Suggestion, Tuner, TunerError

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
                 seed: int | None = None) -> None:
        smac, cs = _smac()
        super().__init__(space, optimize_mode, seed)
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
                                 output_directory=folder, seed=seed if seed is not None else -1)
        self.smac = smac.HyperparameterOptimizationFacade(scenario, _never_called, overwrite=True,
                                                          logging_level=40)
        self._asked: dict[int, Any] = {}
        self._worst: float | None = None

    def suggest(self) -> Suggestion:
        info = self.smac.ask()
        chooser = PreferringChooser(self.rng, dict(info.config))
        params = self.space.sample(chooser)
        pid = self._new_id()
        self._asked[pid] = info
        return Suggestion(pid, params, chooser.raw)

    def observe(self, parameter_id: int, value: float | None) -> None:
        info = self._asked.pop(parameter_id, None)
        if info is not None:
            self._tell(info, value)

    def _tell(self, info: Any, value: float | None) -> None:
        from smac.runhistory.dataclasses import TrialValue

        if value is None:
            cost = self._worst if self._worst is not None else 0.0
        else:
            cost = self.score(value)
            self._worst = cost if self._worst is None else max(self._worst, cost)
        self.smac.tell(info, TrialValue(cost=cost))

    def _replay(self, parameter_id: int, raw: dict[str, Any], value: float | None) -> None:
        from ConfigSpace import Configuration
        from smac.runhistory.dataclasses import TrialInfo

        values = {name: raw.get(name, hp.default_value) for name, hp in self.config_space.items()}
        config = Configuration(self.config_space, values=values, allow_inactive_with_values=True)
        self._tell(TrialInfo(config, seed=0), value)


def _never_called(config: Any, seed: int = 0) -> float:
    raise TunerError("SMAC's target function is not used: trials run on the platform")
