"""Trial-side runtime of trialflow (standard library only; shipped to every worker).

Trial code may use this module directly or, unchanged, NNI's API through the bundled ``nni``
compatibility package (``import nni``) that training services put on the trial's PYTHONPATH.
"""

from __future__ import annotations

import os

from .runtime import (
    get_attempt,
    get_checkpoint_dir,
    get_current_parameter,
    get_experiment_id,
    get_next_parameter,
    get_sequence_id,
    get_trial_id,
    report_final_result,
    report_intermediate_result,
)

#: Directory to put on a trial's PYTHONPATH so that ``import nni`` finds the compatibility package.
NNI_SHIM_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nni_shim")
#: Directory to put on a trial's PYTHONPATH so that ``import trialflow.trial`` works without an install.
RUNTIME_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

__all__ = [
    "NNI_SHIM_DIR",
    "RUNTIME_ROOT",
    "get_attempt",
    "get_checkpoint_dir",
    "get_current_parameter",
    "get_experiment_id",
    "get_next_parameter",
    "get_sequence_id",
    "get_trial_id",
    "report_final_result",
    "report_intermediate_result",
]
