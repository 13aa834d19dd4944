"""The internal space as fixed-length vectors, for model-based tuners (BOHB, Metis, DNGO).

One entry per key of the space (nested options included): a choice is its option index (an
unordered variable), a randint its value scaled into [0, 1], every continuous type its unit value.
A key a configuration does not use (an option it did not choose) is NaN.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..records.search_space import SearchSpace


class UnitVectors:
    def __init__(self, space: SearchSpace) -> None:
        self.params = list(space.walk())
        self.sizes = np.array([len(p.values) if p.type == "choice" else 0 for _, p in self.params])

    def __len__(self) -> int:
        return len(self.params)

    @property
    def kde_types(self) -> str:
        """statsmodels' ``var_type``: ``u`` for a choice, ``c`` for the rest."""
        return "".join("u" if n else "c" for n in self.sizes)

    def vector(self, raw: dict[str, Any]) -> np.ndarray:
        out = np.full(len(self.params), np.nan)
        for j, (key, p) in enumerate(self.params):
            if key in raw:
                if p.type == "randint":
                    low, high = int(p.values[0]), int(p.values[1]) - 1
                    out[j] = (int(raw[key]) - low + 0.5) / (high - low + 1)
                else:
                    out[j] = float(raw[key])
        return out

    def raw(self, vector: np.ndarray) -> dict[str, Any]:
        """Raw values for every key (complete them with :class:`~.base.PreferringChooser`, which keeps
        only the keys the chosen options use)."""
        raw: dict[str, Any] = {}
        for (key, p), v in zip(self.params, vector, strict=True):
            if p.type == "choice":
                raw[key] = int(min(max(round(float(v)), 0), len(p.values) - 1))
            elif p.type == "randint":
                low, high = int(p.values[0]), int(p.values[1]) - 1
                raw[key] = int(min(max(low + int(float(v) * (high - low + 1)), low), high))
            else:
                raw[key] = float(min(max(float(v), 1e-12), 1 - 1e-12))
        return raw

    def random(self, count: int, rng: np.random.Generator) -> np.ndarray:
        """``count`` uniform vectors (a choice's entry is an index)."""
        out = rng.random((count, len(self.params)))
        for j, n in enumerate(self.sizes):
            if n:
                out[:, j] = rng.integers(n, size=count)
        return out

    def features(self, vectors: np.ndarray) -> np.ndarray:
        """Vectors for a regression model: a choice one-hot, NaN as 0.5 (the middle of the range)."""
        columns: list[np.ndarray] = []
        for j, n in enumerate(self.sizes):
            column = vectors[:, j]
            if n:
                columns.extend((column == k).astype(float) for k in range(n))
            else:
                columns.append(np.where(np.isnan(column), 0.5, column))
        return np.column_stack(columns) if columns else np.zeros((len(vectors), 0))
