"""NNI compatibility package: unchanged ``import nni`` trial code runs on trialflow's runtime, and
NNI customized tuners and assessors (``nni.tuner.Tuner``, ``nni.assessor.Assessor``) run in the
controller.

Put on a trial's PYTHONPATH by the training services, and on the controller's ``sys.path`` (after
everything else, so an installed NNI wins) when a customized algorithm is loaded; NNI itself need not
be installed.
"""

from __future__ import annotations

from trialflow.trial.runtime import (
    get_current_parameter,
    get_experiment_id,
    get_next_parameter,
    get_sequence_id,
    get_trial_id,
    report_final_result,
    report_intermediate_result,
)

from .utils import ClassArgsValidator

__version__ = "3.0"
get_next_parameters = get_next_parameter


class NoMoreTrialError(Exception):
    """Raised by a tuner's ``generate_parameters`` when the search space is fully explored."""

    def __init__(self, ErrorInfo: str = "Search space fully explored") -> None:  # noqa: N803 -- NNI's name
        super().__init__(ErrorInfo)
        self.errorinfo = ErrorInfo

__all__ = [
    "ClassArgsValidator",
    "NoMoreTrialError",
    "get_current_parameter",
    "get_experiment_id",
    "get_next_parameter",
    "get_next_parameters",
    "get_sequence_id",
    "get_trial_id",
    "report_final_result",
    "report_intermediate_result",
]
