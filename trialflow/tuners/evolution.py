"""Evolution (NNI's ``Evolution`` tuner): a population of ``population_size`` trials; once full,
each new trial mutates the winner of a random two-way tournament (one raw value redrawn, nested
options resampled where the mutation changes them) and the worst individual is dropped."""

from __future__ import annotations

from ..records.search_space import SearchSpace
from .base import PreferringChooser, RandomChooser, RawHistoryTuner, Suggestion


class EvolutionTuner(RawHistoryTuner):
    def __init__(self, space: SearchSpace, optimize_mode: str = "maximize", seed: int | None = None,
                 population_size: int = 32) -> None:
        super().__init__(space, optimize_mode, seed)
        self.population_size = population_size
        self.population: list[tuple[float, int]] = []  # (score, parameter_id), lower is better

    def suggest(self) -> Suggestion:
        if len(self.population) < self.population_size or len(self.population) < 2:
            chooser: RandomChooser = RandomChooser(self.rng)
        else:
            a, b = self.rng.sample(self.population, 2)
            parent = self._raw[min(a, b)[1]]
            mutate = self.rng.choice(sorted(parent)) if parent else ""
            # the parent's values but the mutated one (redrawn), and nested options new to the mutation
            chooser = PreferringChooser(self.rng, {k: v for k, v in parent.items() if k != mutate})
        return self._emit(chooser)

    def observe(self, parameter_id: int, value: float | None) -> None:
        if value is None or parameter_id not in self._raw:
            return
        self.population.append((self.score(value), parameter_id))
        if len(self.population) > self.population_size:
            self.population.remove(max(self.population))
