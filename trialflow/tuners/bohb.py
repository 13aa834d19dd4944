"""BOHB (NNI's ``BOHB`` advisor): Hyperband's brackets with configurations drawn from a model.

Budgets are Hyperband's with ``R = max_budget`` (``s_max = floor(log_eta(max_budget / min_budget))``),
and brackets run one after another: the next opens once the last round of the current one has ended.
For each budget the results are kept; once a budget holds ``min_points_in_model`` of them (at least
the number of parameters + 1), two multivariate kernel density estimates (statsmodels'
``KDEMultivariate``, the estimator NNI's BOHB uses) are fitted over the internal space: ``l`` on the
best ``top_n_percent`` and ``g`` on the rest. A new configuration is then, with probability
``1 - random_fraction``, the best of ``num_samples`` draws around good points (bandwidths widened by
``bandwidth_factor``, at least ``min_bandwidth``) by ``g(x) / l(x)``, using the largest budget that
has a model; otherwise it is drawn at random.

Internal space: a choice is an unordered variable (its option index), a randint and every continuous
type a value in [0, 1]; keys of nested options a configuration lacks are imputed from others, as NNI's
BOHB does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..records.search_space import SearchSpace
from .base import PreferringChooser, TunerError
from .hyperband import HyperbandTuner
from .vectors import UnitVectors


def _statsmodels() -> Any:
    try:
        from statsmodels.nonparametric.kernel_density import KDEMultivariate
    except ImportError:
        raise TunerError("the BOHB tuner needs statsmodels: pip install 'trialflow[bohb]'") from None
    return KDEMultivariate


class BohbTuner(HyperbandTuner):
    serial_after_last_round = True

    def __init__(self, space: SearchSpace, optimize_mode: str = "maximize", min_budget: int = 1,
                 max_budget: int = 3, eta: int = 3, min_points_in_model: int | None = None,
                 top_n_percent: int = 15, num_samples: int = 64, random_fraction: float = 1 / 3,
                 bandwidth_factor: float = 3, min_bandwidth: float = 1e-3, all_checkpoint_dir: str | None = None,
                 seed: int | None = None) -> None:
        if max_budget < min_budget:
            raise TunerError(f"BOHB: max_budget ({max_budget}) must be at least min_budget ({min_budget})")
        self._kde = _statsmodels()
        super().__init__(space, optimize_mode, R=max_budget, eta=eta, exec_mode="serial",
                         all_checkpoint_dir=all_checkpoint_dir, seed=seed)
        self.s_max = int(np.floor(np.log(max_budget / min_budget) / np.log(eta) + 1e-6))
        self.next_s = self.s_max
        self.vectors = UnitVectors(space)
        self.vartypes = self.vectors.kde_types
        self.min_points = max(min_points_in_model or 0, len(self.vectors) + 1)
        self.top_n_percent, self.num_samples, self.random_fraction = top_n_percent, num_samples, random_fraction
        self.bandwidth_factor, self.min_bandwidth = bandwidth_factor, min_bandwidth
        self.np_rng = np.random.default_rng(seed)
        self.observations: dict[int, list[tuple[np.ndarray, float]]] = {}  # budget -> (vector, loss)
        self.models: dict[int, tuple[Any, Any]] = {}  # budget -> (good KDE, bad KDE)
        self.model_picks = 0  # configurations drawn from a model (the rest were random)

    # -- the model -----------------------------------------------------------------------------
    def new_config(self, budget: int) -> dict[str, Any]:
        if not self.models or self.np_rng.random() < self.random_fraction:
            return super().new_config(budget)
        vector = self._sample_from_model(self.models[max(self.models)])
        if vector is None:
            return super().new_config(budget)
        self.model_picks += 1
        chooser = PreferringChooser(self.rng, self.vectors.raw(vector))  # only the keys its choices make active
        self.space.sample(chooser)
        return chooser.raw

    def _sample_from_model(self, model: tuple[Any, Any]) -> np.ndarray | None:
        good, bad = model
        best, best_vector = np.inf, None
        for _ in range(self.num_samples):
            datum = good.data[self.np_rng.integers(len(good.data))]
            vector = []
            for m, bw, t in zip(datum, good.bw, self.vartypes, strict=True):
                bw = max(bw, self.min_bandwidth)
                if t == "c":
                    bw *= self.bandwidth_factor
                    vector.append(float(np.clip(self.np_rng.normal(m, bw), 0.0, 1.0)))
                else:
                    n = int(self.vectors.sizes[len(vector)])
                    vector.append(int(m) if self.np_rng.random() < 1 - bw else int(self.np_rng.integers(n)))
            ratio = max(1e-32, float(bad.pdf(vector))) / max(float(good.pdf(vector)), 1e-32)
            if np.isfinite(ratio) and ratio < best:
                best, best_vector = ratio, np.asarray(vector, dtype=float)
        return best_vector

    def learn(self, raw: dict[str, Any], budget: int, value: float | None) -> None:
        if self.models and max(self.models) > budget:
            return  # a model on a larger budget already guides the search (NNI's rule)
        loss = np.inf if value is None else self.score(value)
        observations = self.observations.setdefault(budget, [])
        observations.append((self.vectors.vector(raw), loss))
        if len(observations) < self.min_points:
            return
        configs = np.array([o[0] for o in observations])
        losses = np.array([o[1] for o in observations])
        n_good = max(self.min_points, (self.top_n_percent * len(configs)) // 100)
        n_bad = max(self.min_points, ((100 - self.top_n_percent) * len(configs)) // 100)
        order = np.argsort(losses)
        good = self._impute(configs[order[:n_good]])
        bad = self._impute(configs[order[n_good:n_good + n_bad]])
        if good.shape[0] <= good.shape[1] or bad.shape[0] <= bad.shape[1]:
            return
        kdes = []
        for data in (good, bad):
            kde = self._kde(data=data, var_type=self.vartypes, bw="normal_reference")
            kde.bw = np.clip(kde.bw, self.min_bandwidth, None)
            kdes.append(kde)
        self.models[budget] = (kdes[0], kdes[1])

    def _impute(self, array: np.ndarray) -> np.ndarray:
        """Missing (inactive) values taken from another row that has them, else drawn at random."""
        out = array.copy()
        for row in out:
            for j in np.flatnonzero(np.isnan(row)):
                have = np.flatnonzero(np.isfinite(array[:, j]))
                if len(have):
                    row[j] = array[self.np_rng.choice(have), j]
                elif self.vartypes[j] == "u":
                    row[j] = self.np_rng.integers(self.vectors.sizes[j])
                else:
                    row[j] = self.np_rng.random()
        return out
