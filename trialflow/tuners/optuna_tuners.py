"""Tuners backed by Optuna's ask/tell samplers: TPE, Random and CMA-ES; TPE, Random, NSGA-II and
NSGA-III also for several objectives and constraints (``trialflow.tuners.objectives``).

Each suggestion is one in-memory Optuna trial; the search space is walked define-by-run, so
nested choices become conditional parameters. Continuous types are asked as a unit value and
decoded with NNI's formulas (``search_space``), which keeps q-rounding, clipping and the normal
family exact while the sampler models the internal space. Optuna is imported when a tuner is made:
reading a config or listing experiments does not load it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from ..optuna_logging import quietly
from ..search_space import SearchSpace
from .base import Suggestion, Tuner

if TYPE_CHECKING:
    import optuna
    from optuna.distributions import BaseDistribution

    from .objectives import MultiResult, Objectives


class _OptunaChooser:
    def __init__(self, trial: optuna.Trial) -> None:
        self.trial = trial
        self.raw: dict[str, Any] = {}

    def categorical(self, key: str, n: int) -> int:
        self.raw[key] = value = int(self.trial.suggest_categorical(key, list(range(n))))
        return value

    def integer(self, key: str, low: int, high: int) -> int:
        self.raw[key] = value = self.trial.suggest_int(key, low, high)
        return value

    def unit(self, key: str) -> float:
        self.raw[key] = value = self.trial.suggest_float(key, 0.0, 1.0)
        return value


class OptunaTuner(Tuner):
    """Any Optuna sampler behind the Tuner seam (in-memory study, no storage round trip). Given
    ``objectives``, the study has one direction per objective and the tuner is told
    :class:`~trialflow.tuners.objectives.MultiResult` values; their violations are the trial's constraints,
    by name (Optuna's ``set_constraint``), which its samplers respect."""

    def __init__(self, space: SearchSpace, sampler: optuna.samplers.BaseSampler,
                 optimize_mode: str = "minimize", seed: int | None = None,
                 objectives: Objectives | None = None) -> None:
        import optuna

        super().__init__(space, optimize_mode, seed)
        direction: Literal["minimize", "maximize"] = "maximize" if self.maximize else "minimize"
        directions = [direction] if objectives is None else \
            ["maximize" if o.maximize else "minimize" for o in objectives.objectives]
        self.objectives = objectives
        with quietly():
            self.study = optuna.create_study(sampler=sampler, directions=directions)
        self._pending: dict[int, optuna.Trial] = {}
        self._distributions: dict[str, BaseDistribution] = {}

    def suggest(self) -> Suggestion:
        trial = self.study.ask()
        chooser = _OptunaChooser(trial)
        params = self.space.sample(chooser)
        self._distributions.update(trial.distributions)
        pid = self._new_id()
        self._pending[pid] = trial
        return Suggestion(pid, params, chooser.raw)

    def observe(self, parameter_id: int, value: float | MultiResult | None) -> None:  # type: ignore[override]
        from optuna.trial import TrialState

        trial = self._pending.pop(parameter_id, None)
        if trial is None:
            return
        if value is None:
            with quietly():
                self.study.tell(trial, state=TrialState.FAIL)
        elif isinstance(value, float | int):
            with quietly():
                self.study.tell(trial, value)
        else:
            for name, violation in self._constraints(value).items():
                trial.set_constraint(name, violation)
            with quietly():
                self.study.tell(trial, list(value.values))

    def _constraints(self, value: MultiResult) -> dict[str, float]:
        bounds = self.objectives.bounds if self.objectives is not None else ()
        return {bound.name: violation for bound, violation in zip(bounds, value.violations, strict=True)}

    def _replay(self, parameter_id: int, raw: dict[str, Any],  # type: ignore[override]
                value: float | MultiResult | None) -> None:
        import optuna
        from optuna.trial import TrialState

        dists = {key: self._distribution(key, v) for key, v in raw.items()}
        state = TrialState.FAIL if value is None else TrialState.COMPLETE
        if value is None or isinstance(value, float | int):
            trial = optuna.trial.create_trial(params=raw, distributions=dists, value=value, state=state)
        else:
            trial = optuna.trial.create_trial(params=raw, distributions=dists, values=list(value.values), state=state,
                                              constraints=self._constraints(value))
        self.study.add_trial(trial)

    def _distribution(self, key: str, value: Any) -> BaseDistribution:
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        known = self._distributions.get(key)
        if known is not None:
            return known
        for k, p in self.space.walk():
            if k == key:
                if p.type == "choice":
                    return CategoricalDistribution(list(range(len(p.values))))
                if p.type == "randint":
                    return IntDistribution(int(p.values[0]), int(p.values[1]) - 1)
                return FloatDistribution(0.0, 1.0)
        raise KeyError(f"parameter {key!r} of a resumed trial is not in the search space")


def tpe_sampler(seed: int | None, tpe_args: dict[str, Any] | None = None) -> optuna.samplers.BaseSampler:
    import optuna

    return optuna.samplers.TPESampler(seed=seed, **(tpe_args or {}))


def nsga_sampler(version: int, seed: int | None, population_size: int | None) -> optuna.samplers.BaseSampler:
    """Optuna's NSGA-II (``version`` 2) or NSGA-III (3) sampler."""
    import optuna

    size = 50 if population_size is None else population_size  # Optuna's default
    if version == 2:
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=size)
    return optuna.samplers.NSGAIIISampler(seed=seed, population_size=size)


def random_sampler(seed: int | None) -> optuna.samplers.BaseSampler:
    import optuna

    return optuna.samplers.RandomSampler(seed=seed)


def cmaes_sampler(seed: int | None) -> optuna.samplers.BaseSampler:
    import optuna

    return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
