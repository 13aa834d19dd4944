"""Model-based tuners over the unit vectors of the space: NNI's ``MetisTuner``, ``DNGOTuner`` and
``GPTuner``, all on scikit-learn (the ``sklearn`` extra).

Shared lifecycle (:class:`ModelTuner`): the first ``n_initial`` suggestions are random; then every
suggestion refits the model (DNGO: every ``trials_per_update`` results) on the results so far and
proposes the best of many random candidates by the tuner's criterion. Failed trials are left out of
the model. A resumed experiment's results are replayed into it.

``Metis``: a Gaussian process (Matern kernel) over the results. Its candidates, as NNI's Metis: the
minimum of the GP mean (exploitation), the minimum of its 95% lower confidence bound (exploration), a Gaussian
mixture's pick where good results are likely and bad ones not (unless ``no_candidates``), and a
result far from the GP's fit to run again (unless ``no_resampling``). With probability
``exploration_probability`` -- or when the mean's minimum was tried already -- the candidate with the
lowest GP lower confidence bound is taken, else the mean's minimum. NNI's Metis takes numeric types
only (choice of numbers, randint, uniform, quniform): other types are refused when it is created.

``DNGO``: a neural network (three tanh layers of 50) fitted to the results, whose last hidden layer
feeds a Bayesian linear regression; the candidate of largest expected improvement over
``sample_size`` random ones is taken.
"""

from __future__ import annotations

import warnings
from abc import abstractmethod
from typing import Any

import numpy as np

from ..records.search_space import SearchSpace
from .base import PreferringChooser, RandomChooser, Suggestion, Tuner, TunerError
from .objectives import MultiResult, Objectives
from .vectors import UnitVectors

METIS_TYPES = ("choice", "randint", "uniform", "quniform")
LCB_WIDTH = 1.96  # a 95% lower confidence bound


def _sklearn(tuner: str) -> None:
    try:
        import sklearn  # noqa: F401
    except ImportError:
        raise TunerError(f"the {tuner} tuner needs scikit-learn: pip install 'trialflow[sklearn]'") from None


def expected_improvement(mean: np.ndarray, std: np.ndarray, best: float) -> np.ndarray:
    """EI of lower values below ``best``."""
    from scipy.stats import norm

    std = np.maximum(std, 1e-9)
    z = (best - mean) / std
    return np.asarray((best - mean) * norm.cdf(z) + std * norm.pdf(z))


class ModelTuner(Tuner):
    n_initial = 10

    def __init__(self, space: SearchSpace, optimize_mode: str = "maximize", seed: int | None = None) -> None:
        super().__init__(space, optimize_mode, seed)
        self.vectors = UnitVectors(space)
        self.np_rng = np.random.default_rng(seed)
        self.raw: dict[int, dict[str, Any]] = {}
        self.x: list[np.ndarray] = []
        self.y: list[float] = []  # scores: lower is better
        self.tried: list[np.ndarray] = []

    def suggest(self) -> Suggestion:
        vector = self.propose() if len(self.y) >= self.n_initial else None
        chooser = RandomChooser(self.rng) if vector is None else PreferringChooser(self.rng, self.vectors.raw(vector))
        params = self.space.sample(chooser)
        pid = self._new_id()
        self.raw[pid] = chooser.raw
        self.tried.append(self.vectors.vector(chooser.raw))
        return Suggestion(pid, params, chooser.raw)

    def observe(self, parameter_id: int, value: float | None) -> None:
        raw = self.raw.pop(parameter_id, None)
        if raw is not None and value is not None:
            self.x.append(self.vectors.vector(raw))
            self.y.append(self.score(value))
            self.learned()

    def _replay(self, parameter_id: int, raw: dict[str, Any], value: float | None) -> None:
        self.raw[parameter_id] = raw
        self.observe(parameter_id, value)

    def learned(self) -> None:
        """A result was added (default: nothing; the model is fitted when proposing)."""

    def features(self, vectors: np.ndarray) -> np.ndarray:
        return self.vectors.features(vectors)

    def candidates(self, count: int) -> np.ndarray:
        return self.vectors.random(count, self.np_rng)

    @abstractmethod
    def propose(self) -> np.ndarray | None:
        """The model's pick as a unit vector, or None to draw at random (no model yet)."""


class MetisTuner(ModelTuner):
    def __init__(self, space: SearchSpace, optimize_mode: str = "maximize", no_resampling: bool = True,
                 no_candidates: bool = False, selection_num_starting_points: int = 600, cold_start_num: int = 10,
                 exploration_probability: float = 0.9, seed: int | None = None) -> None:
        _sklearn("Metis")
        for key, p in space.walk():
            numeric = p.type != "choice" or all(isinstance(v, int | float) and not isinstance(v, bool)
                                                for v in p.values)
            if p.type not in METIS_TYPES or not numeric:
                raise TunerError(f"the Metis tuner takes only numeric choice, randint, uniform and quniform "
                                 f"parameters (as NNI's); {key!r} is {p.type}{'' if numeric else ' of non-numbers'}")
        super().__init__(space, optimize_mode, seed)
        self.n_initial = max(cold_start_num, 1)
        self.no_resampling, self.no_candidates = no_resampling, no_candidates
        self.points, self.exploration_probability = selection_num_starting_points, exploration_probability

    def propose(self) -> np.ndarray | None:
        from sklearn.exceptions import ConvergenceWarning
        from sklearn.gaussian_process import GaussianProcessRegressor
        from sklearn.gaussian_process.kernels import Matern, WhiteKernel

        x, y = np.array(self.x), np.array(self.y)
        gp = GaussianProcessRegressor(Matern(nu=2.5) + WhiteKernel(1e-3), normalize_y=True, random_state=0)
        with warnings.catch_warnings():  # a length scale at its bound is not the user's problem
            warnings.simplefilter("ignore", ConvergenceWarning)
            gp.fit(self.features(x), y)
        pool = self.candidates(self.points)
        mean, std = gp.predict(self.features(pool), return_std=True)
        exploit = pool[int(np.argmin(mean))]
        candidates = [pool[int(np.argmin(mean - LCB_WIDTH * std))]]  # exploration: the lowest confidence bound
        if not self.no_candidates:
            gmm_pick = self._gmm_pick(x, y, pool)
            if gmm_pick is not None:
                candidates.append(gmm_pick)
        if not self.no_resampling:
            fit_mean, fit_std = gp.predict(self.features(x), return_std=True)
            outliers = np.flatnonzero(np.abs(fit_mean - y) > 2 * np.maximum(fit_std, 1e-9) + 1e-9)
            candidates.extend(x[i] for i in outliers[:1])
        tried = any(np.allclose(exploit, t, equal_nan=True) for t in self.tried)
        if tried or self.np_rng.random() <= self.exploration_probability:
            cm, cs = gp.predict(self.features(np.array(candidates)), return_std=True)
            return np.asarray(candidates[int(np.argmin(cm - LCB_WIDTH * cs))])
        return np.asarray(exploit)

    def _gmm_pick(self, x: np.ndarray, y: np.ndarray, pool: np.ndarray) -> np.ndarray | None:
        """The pool point where a mixture fitted to the best results is most likely relative to one
        fitted to the rest."""
        from sklearn.mixture import GaussianMixture

        order = np.argsort(y)
        cut = max(2, len(y) // 3)
        good, bad = self.features(x[order[:cut]]), self.features(x[order[cut:]])
        if len(bad) < 2:
            return None
        models = [GaussianMixture(min(2, len(d)), covariance_type="diag", reg_covar=1e-3, random_state=0).fit(d)
                  for d in (good, bad)]
        ratio = models[0].score_samples(self.features(pool)) - models[1].score_samples(self.features(pool))
        return np.asarray(pool[int(np.argmax(ratio))])


class DngoTuner(ModelTuner):
    def __init__(self, space: SearchSpace, optimize_mode: str = "maximize", sample_size: int = 1000,
                 trials_per_update: int = 20, num_epochs_per_training: int = 500, seed: int | None = None) -> None:
        _sklearn("DNGO")
        super().__init__(space, optimize_mode, seed)
        self.n_initial = trials_per_update
        self.sample_size, self.trials_per_update, self.epochs = sample_size, trials_per_update, num_epochs_per_training
        self.model: tuple[Any, Any] | None = None

    def learned(self) -> None:
        if len(self.y) % self.trials_per_update == 0:
            self._fit()

    def _fit(self) -> None:
        from sklearn.exceptions import ConvergenceWarning
        from sklearn.linear_model import BayesianRidge
        from sklearn.neural_network import MLPRegressor

        x, y = self.features(np.array(self.x)), np.array(self.y)
        net = MLPRegressor(hidden_layer_sizes=(50, 50, 50), activation="tanh", solver="lbfgs", max_iter=self.epochs,
                           random_state=int(self.np_rng.integers(2**31)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            net.fit(x, (y - y.mean()) / (y.std() or 1.0))
        head = BayesianRidge().fit(self._hidden(net, x), y)
        self.model = (net, head)

    @staticmethod
    def _hidden(net: Any, x: np.ndarray) -> np.ndarray:
        """The last hidden layer's activations: the basis functions of the Bayesian regression."""
        for weights, bias in zip(net.coefs_[:-1], net.intercepts_[:-1], strict=True):
            x = np.tanh(x @ weights + bias)
        return x

    def propose(self) -> np.ndarray | None:
        if self.model is None:
            return None
        net, head = self.model
        pool = self.candidates(self.sample_size)
        mean, std = head.predict(self._hidden(net, self.features(pool)), return_std=True)
        ei = expected_improvement(mean, std, min(self.y))
        return None if not np.isfinite(ei).any() else np.asarray(pool[int(np.nanargmax(ei))])


GRADIENT_STEP = 1e-6  # of the utility's finite differences, in unit-vector coordinates


class GpTuner(ModelTuner):
    """NNI's ``GPTuner`` on scikit-learn: a Gaussian process (Matern kernel of smoothness ``nu``, noise
    ``alpha``) fitted to the results after ``cold_start_num`` random trials; the next trial maximizes
    the ``utility``: expected improvement (``ei``) or probability of improvement (``poi``) beyond the
    best by ``xi``, or the upper confidence bound mean + ``kappa`` x std (``ucb``). As NNI does, the
    utility is evaluated at ``selection_num_warm_up`` random points, then L-BFGS-B runs from
    ``selection_num_starting_points`` random starts (over the continuous parameters; a choice keeps its
    start's option); the best point found is taken.

    Given ``objectives`` it is ParEGO: before each proposal the results are scalarized again with
    weights drawn uniformly from the simplex (:meth:`Objectives.scalarized`: infeasible results cost
    more than every feasible one), so successive proposals aim at different parts of the Pareto front."""

    def __init__(self, space: SearchSpace, optimize_mode: str = "maximize", utility: str = "ei",
                 kappa: float = 5.0, xi: float = 0.0, nu: float = 2.5, alpha: float = 1e-6,
                 cold_start_num: int = 10, selection_num_warm_up: int = 100000,
                 selection_num_starting_points: int = 250, seed: int | None = None,
                 objectives: Objectives | None = None) -> None:
        _sklearn("GP")
        super().__init__(space, optimize_mode, seed)
        self.n_initial = max(cold_start_num, 1)
        self.utility, self.kappa, self.xi, self.nu, self.alpha = utility, kappa, xi, nu, alpha
        self.warm_up, self.starts = selection_num_warm_up, selection_num_starting_points
        self.objectives = objectives
        self.results: list[MultiResult] = []  # with several objectives: self.y is their scalarization

    def observe(self, parameter_id: int, value: float | MultiResult | None) -> None:  # type: ignore[override]
        if not isinstance(value, MultiResult):
            super().observe(parameter_id, value)
            return
        raw = self.raw.pop(parameter_id, None)
        if raw is not None:
            self.x.append(self.vectors.vector(raw))
            self.results.append(value)
            self.y.append(0.0)  # scalarized before each proposal

    def _cost(self, gp: Any, vectors: np.ndarray, best: float) -> np.ndarray:
        """The utility to maximize, negated (scores are lower-is-better; so is the cost)."""
        from scipy.stats import norm

        mean, std = gp.predict(self.features(vectors), return_std=True)
        std = np.maximum(std, 1e-9)
        if self.utility == "ucb":
            return np.asarray(mean - self.kappa * std)
        if self.utility == "poi":
            return np.asarray(-norm.cdf((best - self.xi - mean) / std))
        return -expected_improvement(mean, std, best - self.xi)

    def propose(self) -> np.ndarray | None:
        from scipy.optimize import minimize
        from sklearn.exceptions import ConvergenceWarning
        from sklearn.gaussian_process import GaussianProcessRegressor
        from sklearn.gaussian_process.kernels import Matern

        if self.objectives is not None:
            weights = self.np_rng.dirichlet(np.ones(len(self.objectives.objectives)))
            self.y = self.objectives.scalarized(self.results, weights.tolist())
        gp = GaussianProcessRegressor(Matern(nu=self.nu), alpha=self.alpha, normalize_y=True,
                                      n_restarts_optimizer=25, random_state=0)
        with warnings.catch_warnings():  # a length scale at its bound is not the user's problem
            warnings.simplefilter("ignore", ConvergenceWarning)
            gp.fit(self.features(np.array(self.x)), np.array(self.y))
        best = min(self.y)
        pool = self.candidates(self.warm_up)
        costs = self._cost(gp, pool, best)
        chosen, lowest = pool[int(np.argmin(costs))], float(np.min(costs))
        free = np.flatnonzero(self.vectors.sizes == 0)
        if not len(free):
            return np.asarray(chosen)
        step = np.eye(len(free)) * GRADIENT_STEP
        for start in self.candidates(self.starts):
            def cost(values: np.ndarray, start: np.ndarray = start) -> tuple[float, np.ndarray]:
                """The cost at ``values`` and its forward-difference gradient, in one prediction."""
                points = np.repeat(start[None, :], len(free) + 1, axis=0)
                points[:, free] = np.vstack([values, values + step])
                costs = self._cost(gp, points, best)
                return float(costs[0]), (costs[1:] - costs[0]) / GRADIENT_STEP

            found = minimize(cost, start[free], jac=True, bounds=[(0.0, 1.0)] * len(free), method="L-BFGS-B")
            if found.fun < lowest:
                chosen, lowest = start.copy(), float(found.fun)
                chosen[free] = np.clip(found.x, 0.0, 1.0)
        return np.asarray(chosen)
