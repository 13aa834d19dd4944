"""Anneal: sample near good past trials with a neighbourhood that shrinks as trials accumulate.

Follows hyperopt's anneal algorithm that NNI's ``Anneal`` tuner wraps: pick one of the best trials
(geometric over the ranking, mean ``avg_best_idx``), then redraw each raw value around it with a
width ``1 / (1 + n * shrink_coef)`` of its range; categorical values are kept with probability
``1 - width``. Until ``n_startup`` outcomes are known it samples the prior.
"""

from __future__ import annotations

import math
from typing import Any

from ..records.search_space import SearchSpace
from .base import RandomChooser, RawHistoryTuner, Suggestion


class _AnnealChooser(RandomChooser):
    def __init__(self, tuner: AnnealTuner, base: dict[str, Any], width: float) -> None:
        super().__init__(tuner.rng)
        self.base, self.width = base, width

    def draw_categorical(self, key: str, n: int) -> int:
        if key in self.base and self.rng.random() > self.width:
            return int(self.base[key])
        return self.rng.randrange(n)

    def draw_integer(self, key: str, low: int, high: int) -> int:
        if key not in self.base:
            return self.rng.randint(low, high)
        center = int(self.base[key])
        spread = max(1.0, self.width * (high - low))
        value = round(self.rng.gauss(center, spread))
        return min(max(value, low), high)

    def draw_unit(self, key: str) -> float:
        if key not in self.base:
            return self.rng.random()
        value = self.rng.gauss(float(self.base[key]), self.width / 2)
        return min(max(value, 1e-9), 1 - 1e-9)


class AnnealTuner(RawHistoryTuner):
    def __init__(self, space: SearchSpace, optimize_mode: str = "minimize", seed: int | None = None,
                 n_startup: int = 10, avg_best_idx: float = 2.0, shrink_coef: float = 0.1) -> None:
        super().__init__(space, optimize_mode, seed)
        self.n_startup, self.avg_best_idx, self.shrink_coef = n_startup, avg_best_idx, shrink_coef
        self._scored: list[tuple[float, int]] = []  # (score, parameter_id), lower is better

    def suggest(self) -> Suggestion:
        if len(self._scored) < self.n_startup:
            chooser: RandomChooser = RandomChooser(self.rng)
        else:
            ranked = sorted(self._scored)
            p = 1.0 / (1.0 + self.avg_best_idx)
            index = min(int(math.log(1 - self.rng.random()) / math.log(1 - p)), len(ranked) - 1)
            width = 1.0 / (1.0 + len(self._scored) * self.shrink_coef)
            chooser = _AnnealChooser(self, self._raw[ranked[index][1]], width)
        return self._emit(chooser)

    def observe(self, parameter_id: int, value: float | None) -> None:
        if value is not None and parameter_id in self._raw:
            self._scored.append((self.score(value), parameter_id))
