"""Tuners backed by Optuna's ask/tell samplers: TPE, Random and CMA-ES; TPE, Random, NSGA-II and
NSGA-III also for several objectives and constraints (``trialflow.tuners.objectives``).

Each suggestion is one in-memory Optuna trial; the search space is walked define-by-run, so
nested choices become conditional parameters. Continuous types are asked as a unit value and
decoded with NNI's formulas (``search_space``), which keeps q-rounding, clipping and the normal
family exact while the sampler models the internal space. Optuna is imported when a tuner is made:
reading a config or listing experiments does not load it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from ..foundation.optuna_logging import quietly
from ..records.search_space import SearchSpace
from .base import Suggestion, Tuner

if TYPE_CHECKING:
    import optuna
    from optuna.distributions import BaseDistribution

    from .objectives import MultiResult, Objectives

SamplerFactory = Callable[[int | None], "optuna.samplers.BaseSampler"]  # a seed -> a new sampler


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
    by name (Optuna's ``set_constraint``), which its samplers respect.

    ``window`` (size, best), one objective only: once the study holds more than ``size`` finished trials,
    a new study with a new sampler holds the ``best`` best of them and the most recent ``size // 2`` (in
    their order) and the trials still running, so that a sampler whose cost grows with its history (TPE)
    costs the same at any length of it."""

    def __init__(self, space: SearchSpace, sampler: SamplerFactory, optimize_mode: str = "minimize",
                 seed: int | None = None, objectives: Objectives | None = None,
                 window: tuple[int, int] | None = None) -> None:
        super().__init__(space, optimize_mode, seed)
        direction: Literal["minimize", "maximize"] = "maximize" if self.maximize else "minimize"
        self._directions = [direction] if objectives is None else \
            ["maximize" if o.maximize else "minimize" for o in objectives.objectives]
        self.objectives = objectives
        self._sampler = sampler
        self._window = window if objectives is None else None
        self._finished = 0  # the current study's finished trials
        self.study = self._new_study(seed)
        # parameter id -> its trial asked from the current study, or the number of its copy in a newer one
        self._pending: dict[int, optuna.Trial | int] = {}
        self._distributions: dict[str, BaseDistribution] = {}

    def _new_study(self, seed: int | None) -> optuna.Study:
        import optuna

        with quietly():
            return optuna.create_study(sampler=self._sampler(seed), directions=self._directions)

    def _told(self) -> None:
        """A trial ended; past the window's size, the study is replaced by one holding what the window keeps."""
        self._finished += 1
        if self._window is None or self._finished <= self._window[0]:
            return
        from optuna.trial import TrialState

        size, best = self._window
        done = self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        ranked = sorted(done, key=lambda t: self.score(float(t.value or 0.0)))[:best]
        keep = {t.number for t in ranked} | {t.number for t in done[-(size // 2):]}
        running = {t.number: t for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
        self.study = self._new_study(None if self.seed is None else self.rng.randrange(2**31))
        kept = [t for t in done if t.number in keep]
        with quietly():
            self.study.add_trials(kept)
            for number, (pid, asked) in enumerate(self._pending.items(), start=len(kept)):
                self.study.add_trial(running[asked if isinstance(asked, int) else asked.number])
                self._pending[pid] = number
        self._finished = len(kept)

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

        asked = self._pending.pop(parameter_id, None)
        if asked is None:
            return
        with quietly():
            if value is None:
                self.study.tell(asked, state=TrialState.FAIL)
            elif isinstance(value, float | int):
                self.study.tell(asked, value)
            else:
                assert not isinstance(asked, int)  # renumbered only under a window: one objective, no constraints
                for name, violation in self._constraints(value).items():
                    asked.set_constraint(name, violation)
                self.study.tell(asked, list(value.values))
        self._told()

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
        self._told()

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
