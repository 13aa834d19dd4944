"""Evolution (NNI's ``Evolution`` tuner): a population of ``population_size`` trials; once full,
each new trial mutates the winner of a random two-way tournament (one raw value redrawn, nested
options resampled where the mutation changes them) and the worst individual is dropped."""

from __future__ import annotations

from typing import Any

from ..search_space import SearchSpace
from .base import RandomChooser, RawHistoryTuner, Suggestion


class _MutationChooser(RandomChooser):
    def __init__(self, tuner: EvolutionTuner, parent: dict[str, Any], mutate: str) -> None:
        super().__init__(tuner.rng)
        self.parent, self.mutate = parent, mutate

    def draw_categorical(self, key: str, n: int) -> int:
        return int(self.parent[key]) if key in self.parent and key != self.mutate else self.rng.randrange(n)

    def draw_integer(self, key: str, low: int, high: int) -> int:
        return int(self.parent[key]) if key in self.parent and key != self.mutate else self.rng.randint(low, high)

    def draw_unit(self, key: str) -> float:
        return float(self.parent[key]) if key in self.parent and key != self.mutate else self.rng.random()


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
            chooser = _MutationChooser(self, parent, self.rng.choice(sorted(parent)) if parent else "")
        return self._emit(chooser)

    def observe(self, parameter_id: int, value: float | None) -> None:
        if value is None or parameter_id not in self._raw:
            return
        self.population.append((self.score(value), parameter_id))
        if len(self.population) > self.population_size:
            self.population.remove(max(self.population))
