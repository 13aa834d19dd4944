"""Population Based Training (NNI's ``PBTTuner``): a population trained step by step, the worst
replaced by perturbed copies of the best between steps.

Each generation runs ``population_size`` trials, one per member. A trial's parameters carry NNI's
``load_checkpoint_dir`` (where the member's model was saved by the previous step; at step 0 the same
as the save dir, still empty) and ``save_checkpoint_dir`` (``<all_checkpoint_dir>/<member>/<step>``):
the trial loads, trains one step, saves and reports. Once every member's trial has ended, members are
ranked; each of the worst ``ceil(fraction * population_size)`` takes a random one of the best as
parent: its checkpoint to load and its parameters, each perturbed (redrawn with probability
``resample_probability``, else moved up or down by ``factor`` of its range in the internal space --
NNI's rule for the uniform and log-uniform types; a choice or randint moves one step). The others go
on from their own checkpoints. A failed trial ranks last.

Without ``all_checkpoint_dir`` the folders are ``checkpoint/<member>/<step>`` relative to the
experiment's folder on the platform, which the trial runtime resolves (and creates) where the trial
runs: local, remote and shared-storage trials of one experiment share it. Give an absolute
``all_checkpoint_dir`` on shared storage when trials of one experiment run on several machines.

Lifecycle: the tuner waits (:meth:`can_suggest` is False) while a generation's trials run; a resumed
experiment goes on after the last generation whose trials all ended.
"""

from __future__ import annotations

import math
import posixpath
from dataclasses import dataclass
from typing import Any

from ..records.search_space import ReplayChooser, SearchSpace
from .base import LOAD_KEY, SAVE_KEY, RandomChooser, Suggestion, Tuner

DEFAULT_CHECKPOINT_DIR = "checkpoint"  # relative: resolved by the trial runtime in the experiment's folder


@dataclass
class Member:
    index: int
    raw: dict[str, Any]
    load_dir: str
    save_dir: str
    score: float = math.inf  # lower is better; a failed trial keeps inf


class PbtTuner(Tuner):
    def __init__(self, space: SearchSpace, optimize_mode: str = "maximize", all_checkpoint_dir: str | None = None,
                 population_size: int = 10, factor: float = 0.2, resample_probability: float = 0.25,
                 fraction: float = 0.2, seed: int | None = None) -> None:
        super().__init__(space, optimize_mode, seed)
        self.root = all_checkpoint_dir or DEFAULT_CHECKPOINT_DIR
        self.population_size, self.factor = population_size, factor
        self.resample_probability, self.fraction = resample_probability, fraction
        self.step = 0
        self.population = [self._member(i, self._random_raw()) for i in range(population_size)]
        self.handed = 0  # members of this generation handed out
        self.running: dict[int, Member] = {}
        self.finished: list[Member] = []
        self._history: list[tuple[dict[str, Any], float | None]] = []  # replayed trials, for a resume

    def _dir(self, index: int, step: int) -> str:
        return posixpath.join(self.root, str(index), str(step))

    def _member(self, index: int, raw: dict[str, Any]) -> Member:
        here = self._dir(index, self.step)
        return Member(index, raw, here, here)

    def _random_raw(self) -> dict[str, Any]:
        chooser = RandomChooser(self.rng)
        self.space.sample(chooser)
        return chooser.raw

    def can_suggest(self) -> bool:
        if self._history:
            self._restore()
        return self.handed < len(self.population)

    def suggest(self) -> Suggestion | None:
        if not self.can_suggest():
            return None
        member = self.population[self.handed]
        self.handed += 1
        pid = self._new_id()
        self.running[pid] = member
        params = {**self.space.sample(ReplayChooser(member.raw)), LOAD_KEY: member.load_dir, SAVE_KEY: member.save_dir}
        raw = {**member.raw, "pbt": {"member": member.index, "step": self.step,
                                     LOAD_KEY: member.load_dir, SAVE_KEY: member.save_dir}}
        return Suggestion(pid, params, raw)

    def observe(self, parameter_id: int, value: float | None) -> None:
        member = self.running.pop(parameter_id, None)
        if member is None:
            return
        member.score = math.inf if value is None else self.score(value)
        self.finished.append(member)
        if len(self.finished) == len(self.population):
            self._next_generation()

    def _next_generation(self) -> None:
        self.step += 1
        ranked = sorted(self.finished, key=lambda m: m.score)
        cutoff = math.ceil(self.fraction * len(ranked))
        tops, bottoms = ranked[:cutoff], ranked[len(ranked) - cutoff:]
        population = []
        for member in ranked:
            if member in bottoms and tops:
                parent = self.rng.choice(tops)
                raw, load = self._perturbed(parent.raw), parent.save_dir
            else:
                raw, load = member.raw, member.save_dir
            population.append(Member(member.index, raw, load, self._dir(member.index, self.step)))
        self.population = sorted(population, key=lambda m: m.index)
        self.finished, self.handed = [], 0

    def _perturbed(self, raw: dict[str, Any]) -> dict[str, Any]:
        chooser = _PerturbingChooser(self.rng, raw, self.factor, self.resample_probability)
        self.space.sample(chooser)
        return chooser.raw

    # -- resume --------------------------------------------------------------------------------
    def _replay(self, parameter_id: int, raw: dict[str, Any], value: float | None) -> None:
        self._history.append((raw, value))

    def _restore(self) -> None:
        """Go on after the last generation whose trials all ended (NNI's ``import_data`` rule)."""
        steps: dict[int, dict[int, Member]] = {}
        for raw, value in self._history:
            info = raw.get("pbt")
            if not isinstance(info, dict):
                continue
            member = Member(int(info["member"]), {k: v for k, v in raw.items() if k != "pbt"},
                            info[LOAD_KEY], info[SAVE_KEY], math.inf if value is None else self.score(value))
            steps.setdefault(int(info["step"]), {})[member.index] = member
        self._history = []
        complete = [s for s, members in steps.items() if len(members) >= self.population_size]
        if not complete:
            return
        self.step = max(complete)
        self.finished = list(steps[self.step].values())[: self.population_size]
        self.population = self.finished
        self._next_generation()


class _PerturbingChooser(RandomChooser):
    """The parent's raw values, each redrawn with probability ``resample``, else moved: a unit value
    by +/- ``factor``, a choice index or randint by one step (clipped to the range)."""

    def __init__(self, rng: Any, parent: dict[str, Any], factor: float, resample: float) -> None:
        super().__init__(rng)
        self.parent, self.factor, self.resample = parent, factor, resample

    def _keep(self, key: str) -> bool:
        return key in self.parent and self.rng.random() >= self.resample

    def _direction(self) -> int:
        return 1 if self.rng.random() > 0.5 else -1

    def draw_categorical(self, key: str, n: int) -> int:
        if not self._keep(key):
            return self.rng.randrange(n)
        return min(max(int(self.parent[key]) + self._direction(), 0), n - 1)

    def draw_integer(self, key: str, low: int, high: int) -> int:
        if not self._keep(key):
            return self.rng.randint(low, high)
        return min(max(int(self.parent[key]) + self._direction(), low), high)

    def draw_unit(self, key: str) -> float:
        if not self._keep(key):
            return self.rng.random()
        return min(max(float(self.parent[key]) + self._direction() * self.factor, 1e-12), 1 - 1e-12)
