"""``nni.tuner.Tuner``: the base class of NNI customized tuners, with NNI's call contract.

trialflow calls, in this order: ``update_search_space(space)`` once with the search space as written
in the config; ``import_data([{"parameter", "value"}, ...])`` with the finished trials of a resumed
experiment; then ``generate_multiple_parameters([id])`` for each new trial (the default calls
``generate_parameters``; an empty list or ``nni.NoMoreTrialError`` ends suggestion);
``receive_trial_result(id, parameters, value)`` with the reported final result as the trial sent
it (a number, or a dict with a ``default`` key), and ``trial_end(id, success)`` when a trial ends.
Calls are serialised (never concurrent).

A subclass defines ``generate_parameters`` (or ``generate_multiple_parameters``),
``receive_trial_result`` and ``update_search_space`` itself: NNI calls all three in every experiment.
This class leaves them out (NNI's own defines placeholders that fail at their first call, mid-experiment);
``trialflow create`` refuses a class that lacks one, naming it, before anything starts.
"""

from __future__ import annotations

from typing import Any

from .recoverable import Recoverable

__all__ = ["Tuner"]


class Tuner(Recoverable):
    """The base of NNI customized tuners; the methods a subclass defines are in the module doc."""

    def generate_multiple_parameters(self, parameter_id_list: list[int], **kwargs: Any) -> list[Any]:
        """One set of parameters per id, until the subclass's ``generate_parameters`` raises
        ``NoMoreTrialError``."""
        from . import NoMoreTrialError

        result = []
        for parameter_id in parameter_id_list:
            try:
                result.append(self.generate_parameters(parameter_id, **kwargs))  # type: ignore[attr-defined]
            except NoMoreTrialError:
                break
        return result

    def trial_end(self, parameter_id: int, success: bool, **kwargs: Any) -> None:
        """A trial ended: ``success`` is False when it failed or was cancelled."""

    def import_data(self, data: list[dict[str, Any]]) -> None:
        """Finished trials (``{"parameter": ..., "value": ...}``) from before a resume, or imported."""

    def _accept_customized_trials(self, accept: bool = True) -> None:
        self._accept_customized = accept

    def _on_exit(self) -> None:
        pass

    def _on_error(self) -> None:
        pass
