"""Hyperband (NNI's ``Hyperband`` advisor): successive halving in brackets, budgets passed to trials.

Each trial's parameters carry ``TRIAL_BUDGET`` (NNI's key), the resource it may use (epochs, batches,
seconds: the trial code decides). With ``R`` the largest budget and ``eta`` the halving rate,
``s_max = floor(log_eta(R))``; bracket ``s`` (from ``s_max`` down to 0, then again) starts
``n = ceil((s_max + 1) * eta**s / (s + 1))`` configurations at budget ``floor(R / eta**s)``; when every
trial of round ``i`` has ended, the best ``floor(n / eta**(i+1))`` of them (by final result, else their
latest intermediate one) run again as new trials at budget ``floor(R / eta**s * eta**(i+1))``.
A trial that failed without any result is never promoted.

``exec_mode: parallelism`` (default) opens the next bracket whenever nothing is queued, so no slot
idles; ``serial`` opens it only once the current bracket has handed out its last round.

Beyond NNI, with ``all_checkpoint_dir`` (as PBT's) each trial also gets ``load_checkpoint_dir`` and
``save_checkpoint_dir`` (``<all_checkpoint_dir>/<configuration>/<round>``): a promoted
configuration's trial can load what its previous round saved and train only the rest of its budget,
as Ray Tune's schedulers resume paused trials. Without it trials get NNI's parameters only.

Lifecycle: the experiment loop asks :meth:`Tuner.can_suggest` first; while a round waits for its
trials nothing is suggested (the tuner is *waiting*, not exhausted). Brackets never run out: the
experiment ends at ``maxTrialNumber`` or ``maxExperimentDuration``. A resumed experiment starts with
a fresh first bracket, as NNI's advisor does; its finished trials are not ranked again.
"""

from __future__ import annotations

import math
import posixpath
from dataclasses import dataclass, field
from typing import Any

from ..records.search_space import ReplayChooser, SearchSpace
from .base import LOAD_KEY, SAVE_KEY, RandomChooser, Suggestion, Tuner

BUDGET_KEY = "TRIAL_BUDGET"
_EPSILON = 1e-6


@dataclass
class Config:
    """One configuration in one round: its raw values and its best-known result."""

    raw: dict[str, Any]
    lineage: int  # the configuration's number, kept across rounds (its checkpoint folder)
    result: float | None = None  # the final result, else the latest intermediate one
    final: bool = False


@dataclass
class Bracket:
    """Successive halving over ``n`` configurations, NNI's arithmetic (an epsilon guards the floors)."""

    s: int
    s_max: int
    eta: int
    max_budget: float
    rounds: list[dict[int, Config]] = field(default_factory=list)  # round -> parameter id -> config handed out
    sizes: list[int] = field(default_factory=list)  # per round: configurations queued (NNI's num_configs_to_run)
    ended: list[int] = field(default_factory=list)  # per round: trials ended

    @property
    def n(self) -> int:
        return math.ceil((self.s_max + 1) * self.eta ** self.s / (self.s + 1) - _EPSILON)

    def size_and_budget(self, i: int) -> tuple[int, int]:
        """(configurations, budget) of round ``i``."""
        r = self.max_budget / self.eta ** self.s
        return math.floor(self.n / self.eta ** i + _EPSILON), math.floor(r * self.eta ** i + _EPSILON)

    @property
    def handed_out(self) -> bool:
        """Every round has been queued (NNI's ``is_completed`` of Hyperband)."""
        return len(self.rounds) > self.s

    @property
    def finished(self) -> bool:
        """Every trial of the last round has ended."""
        return self.handed_out and self.ended[-1] >= self.sizes[-1]

    def survivors(self, i: int, maximize: bool) -> list[tuple[dict[str, Any], int]]:
        """(raw values, lineage) of round ``i``'s best configurations for round ``i + 1``."""
        ranked = sorted((c for c in self.rounds[i].values() if c.result is not None),
                        key=lambda c: c.result, reverse=maximize)  # type: ignore[arg-type, return-value]
        count, _ = self.size_and_budget(i + 1)
        return [(c.raw, c.lineage) for c in ranked[:count]]


class HyperbandTuner(Tuner):
    """NNI's Hyperband; subclasses choose how a new configuration is drawn (:meth:`new_config`)."""

    serial_after_last_round = False  # BOHB: the next bracket waits until the last round has ended

    def __init__(self, space: SearchSpace, optimize_mode: str = "maximize", R: int = 60, eta: int = 3,
                 exec_mode: str = "parallelism", all_checkpoint_dir: str | None = None,
                 seed: int | None = None) -> None:
        super().__init__(space, optimize_mode, seed)
        self.R, self.eta, self.exec_mode = R, eta, exec_mode
        self.checkpoints = all_checkpoint_dir
        self.lineages = 0
        self.s_max = math.floor(math.log(R, eta) + _EPSILON)
        self.next_s = self.s_max
        self.brackets: list[Bracket] = []
        self.queue: list[tuple[Bracket, int, dict[str, Any], int]] = []  # (bracket, round, raw values, lineage)
        self.placed: dict[int, tuple[Bracket, int]] = {}  # parameter id -> (bracket, round)

    # -- how configurations are drawn and learned from (BOHB overrides) --------------------------
    def new_config(self, budget: int) -> dict[str, Any]:
        chooser = RandomChooser(self.rng)
        self.space.sample(chooser)
        return chooser.raw

    def learn(self, raw: dict[str, Any], budget: int, value: float | None) -> None:
        """A trial at ``budget`` ended with ``value`` (None: failed or no result)."""

    # -- the seam ------------------------------------------------------------------------------
    def can_suggest(self) -> bool:
        return bool(self.queue) or self._may_open_bracket()

    def suggest(self) -> Suggestion | None:
        if not self.queue:
            if not self._may_open_bracket():
                return None
            self._open_bracket()
        bracket, i, raw, lineage = self.queue.pop(0)
        _, budget = bracket.size_and_budget(i)
        pid = self._new_id()
        bracket.rounds[i][pid] = Config(raw, lineage)
        self.placed[pid] = (bracket, i)
        params = {**self.space.sample(ReplayChooser(raw)), BUDGET_KEY: budget}
        if self.checkpoints is not None:
            folder = posixpath.join(self.checkpoints, str(lineage))
            params[SAVE_KEY] = posixpath.join(folder, str(i))
            params[LOAD_KEY] = posixpath.join(folder, str(max(i - 1, 0)))
        return Suggestion(pid, params, {**raw, BUDGET_KEY: budget})

    def intermediate_results(self, parameter_id: int, values: list[float]) -> None:
        config = self._config(parameter_id)
        if config is not None and not config.final and values:
            config.result = values[-1]

    def observe(self, parameter_id: int, value: float | None) -> None:
        config = self._config(parameter_id)
        if config is None:
            return
        bracket, i = self.placed.pop(parameter_id)
        if value is not None:
            config.result, config.final = value, True
        self.learn(config.raw, bracket.size_and_budget(i)[1], config.result if config.final else None)
        bracket.ended[i] += 1
        if bracket.ended[i] >= bracket.sizes[i] and not bracket.handed_out:
            self._queue_round(bracket, bracket.survivors(i, self.maximize))

    def _replay(self, parameter_id: int, raw: dict[str, Any], value: float | None) -> None:
        """A trial of an earlier run: its brackets are gone (as in NNI); only the model may learn."""
        budget = raw.get(BUDGET_KEY)
        if isinstance(budget, int | float):
            self.learn({k: v for k, v in raw.items() if k != BUDGET_KEY}, int(budget), value)

    # -- brackets ------------------------------------------------------------------------------
    def _config(self, parameter_id: int) -> Config | None:
        where = self.placed.get(parameter_id)
        return where[0].rounds[where[1]].get(parameter_id) if where else None

    def _may_open_bracket(self) -> bool:
        if self.exec_mode == "parallelism" and not self.serial_after_last_round:
            return True
        current = self.brackets[-1] if self.brackets else None
        if current is None:
            return True
        return current.finished if self.serial_after_last_round else current.handed_out

    def _open_bracket(self) -> None:
        if self.next_s < 0:
            self.next_s = self.s_max
        bracket = Bracket(self.next_s, self.s_max, self.eta, self.R)
        self.next_s -= 1
        self.brackets.append(bracket)
        count, budget = bracket.size_and_budget(0)
        self.lineages += count
        self._queue_round(bracket, [(self.new_config(budget), self.lineages - count + k) for k in range(count)])

    def _queue_round(self, bracket: Bracket, configs: list[tuple[dict[str, Any], int]]) -> None:
        i = len(bracket.rounds)
        bracket.rounds.append({})
        bracket.sizes.append(len(configs))
        bracket.ended.append(0)
        self.queue.extend((bracket, i, raw, lineage) for raw, lineage in configs)
        if not configs:  # nobody to promote: the bracket is over
            while not bracket.handed_out:
                bracket.rounds.append({})
                bracket.sizes.append(0)
                bracket.ended.append(0)
