"""``nni.assessor``: the base class of NNI customized assessors.

trialflow calls ``assess_trial(trial_job_id, trial_history)`` after each new intermediate result of
a running trial (the history holds every intermediate result so far, in order); ``AssessResult.Bad``
stops the trial as EARLY_STOPPED. ``trial_end(trial_job_id, success)`` follows once per trial.

A subclass defines ``assess_trial`` itself. This class leaves it out (NNI's own defines a placeholder
that fails at its first call, mid-experiment); ``trialflow create`` refuses a class that lacks it.
"""

from __future__ import annotations

from enum import Enum

from .recoverable import Recoverable

__all__ = ["AssessResult", "Assessor"]


class AssessResult(Enum):
    Good = True
    Bad = False


class Assessor(Recoverable):
    """Subclasses define ``assess_trial(trial_job_id, trial_history)``: whether the trial should go on
    (``AssessResult.Good``) or be stopped early (``AssessResult.Bad``)."""

    def trial_end(self, trial_job_id: str, success: bool) -> None:
        """A trial ended: ``success`` is False when it failed or was cancelled."""

    def _on_exit(self) -> None:
        pass

    def _on_error(self) -> None:
        pass
