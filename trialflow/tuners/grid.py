"""Deterministic tuners: GridSearch (finite grid, continuous types refined as NNI does) and Batch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..records.search_space import ReplayChooser, SearchSpace, grid_points
from .base import Suggestion, Tuner, TunerError

if TYPE_CHECKING:
    from .objectives import Objectives


class GridSearchTuner(Tuner):
    """Every grid point once, in NNI's order; ``suggest()`` returns None when the grid is done. The
    grid does not depend on outcomes, so it takes several ``objectives`` as readily as one."""

    def __init__(self, space: SearchSpace, optimize_mode: str = "minimize", seed: int | None = None,
                 objectives: Objectives | None = None) -> None:
        super().__init__(space, optimize_mode, seed)
        self._points = grid_points(space)
        self._done: set[tuple[tuple[str, Any], ...]] = set()

    def suggest(self) -> Suggestion | None:
        for point in self._points:
            if tuple(sorted(point.items())) in self._done:
                continue  # already ran before a resume
            return Suggestion(self._new_id(), self.space.sample(ReplayChooser(point)), point)
        return None

    def observe(self, parameter_id: int, value: object) -> None:
        """The grid does not depend on outcomes."""

    def _replay(self, parameter_id: int, raw: dict[str, Any], value: object) -> None:
        self._done.add(tuple(sorted(raw.items())))


class BatchTuner(GridSearchTuner):
    """NNI's Batch tuner: the space is one ``choice`` whose options are complete configurations."""

    def __init__(self, space: SearchSpace, optimize_mode: str = "minimize", seed: int | None = None) -> None:
        if len(space.params) != 1 or space.params[0].type != "choice":
            raise TunerError("Batch tuner: the search space must be a single 'choice' parameter listing "
                             "the configurations to run")
        super().__init__(space, optimize_mode, seed)
