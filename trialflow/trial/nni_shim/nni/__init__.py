"""NNI compatibility package: unchanged ``import nni`` trial code runs on trialflow's runtime.

Put on a trial's PYTHONPATH by the training services; NNI itself need not be installed.
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

__version__ = "3.0"
get_next_parameters = get_next_parameter

__all__ = [
    "get_current_parameter",
    "get_experiment_id",
    "get_next_parameter",
    "get_next_parameters",
    "get_sequence_id",
    "get_trial_id",
    "report_final_result",
    "report_intermediate_result",
]
