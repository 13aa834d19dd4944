"""``nni.assessor``: the base class of NNI customized assessors.

trialflow calls ``assess_trial(trial_job_id, trial_history)`` after each new intermediate result of
a running trial (the history holds every intermediate result so far, in order); ``AssessResult.Good``
lets it go on, ``AssessResult.Bad`` stops it as EARLY_STOPPED. ``trial_end(trial_job_id, success)``
follows once per trial.

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
    """The base of NNI customized assessors; the method a subclass defines is in the module doc."""

    def trial_end(self, trial_job_id: str, success: bool) -> None:
        """A trial ended: ``success`` is False when it failed or was cancelled."""

    def _on_exit(self) -> None:
        pass

    def _on_error(self) -> None:
        pass
