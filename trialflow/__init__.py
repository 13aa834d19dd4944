"""trialflow: hyperparameter-tuning experiments on any training platform, orchestrated by Prefect.

The public API is imported lazily so that ``import trialflow.trial`` (inside trials, on workers)
stays standard-library only and fast.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing stays unimported at run time: its import would cost every trial process
if TYPE_CHECKING:
    from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "run_experiment": "trialflow.api",
    "ExperimentResult": "trialflow.api",
    "experiment_session": "trialflow.api",
    "resume_experiment": "trialflow.api",
    "stop_experiment": "trialflow.api",
    "kill_trial": "trialflow.api",
    "update_experiment": "trialflow.api",
    "update_search_space": "trialflow.api",
    "delete_experiment": "trialflow.api",
    "prefect_api": "trialflow.api",
    "UserError": "trialflow.user_errors",
    "ExperimentConfig": "trialflow.config",
    "ConfigError": "trialflow.config",
    "load_config": "trialflow.config",
    "parse_config": "trialflow.config",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'trialflow' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
