"""``nni.tuner.Tuner``: the base class of NNI customized tuners, with NNI's call contract.

trialflow calls, in this order: ``update_search_space(space)`` once with the search space as written
in the config; ``import_data([{"parameter", "value"}, ...])`` with the finished trials of a resumed
experiment; then ``generate_multiple_parameters([id])`` for each new trial (the default calls
``generate_parameters``; an empty list or ``nni.NoMoreTrialError`` ends suggestion);
``receive_trial_result(id, parameters, value)`` with the reported final result as the trial sent
it, and ``trial_end(id, success)`` when a trial ends. Calls are serialised (never concurrent).
"""

from __future__ import annotations

from typing import Any

from .recoverable import Recoverable

__all__ = ["Tuner"]


class Tuner(Recoverable):
    def generate_parameters(self, parameter_id: int, **kwargs: Any) -> Any:
        """Parameters of the new trial ``parameter_id`` (override this or
        :meth:`generate_multiple_parameters`); raise ``nni.NoMoreTrialError`` when there are no more."""
        raise NotImplementedError("Tuner: generate_parameters not implemented")

    def generate_multiple_parameters(self, parameter_id_list: list[int], **kwargs: Any) -> list[Any]:
        """One set of parameters per id, until ``generate_parameters`` raises ``NoMoreTrialError``."""
        from . import NoMoreTrialError

        result = []
        for parameter_id in parameter_id_list:
            try:
                result.append(self.generate_parameters(parameter_id, **kwargs))
            except NoMoreTrialError:
                break
        return result

    def receive_trial_result(self, parameter_id: int, parameters: Any, value: Any, **kwargs: Any) -> None:
        """The final result a trial reported (a number, or a dict with a ``default`` key)."""
        raise NotImplementedError("Tuner: receive_trial_result not implemented")

    def trial_end(self, parameter_id: int, success: bool, **kwargs: Any) -> None:
        """A trial ended: ``success`` is False when it failed or was cancelled."""

    def update_search_space(self, search_space: Any) -> None:
        """The experiment's search space, as written in the config."""
        raise NotImplementedError("Tuner: update_search_space not implemented")

    def import_data(self, data: list[dict[str, Any]]) -> None:
        """Finished trials (``{"parameter": ..., "value": ...}``) from before a resume, or imported."""

    def _accept_customized_trials(self, accept: bool = True) -> None:
        self._accept_customized = accept

    def _on_exit(self) -> None:
        pass

    def _on_error(self) -> None:
        pass
