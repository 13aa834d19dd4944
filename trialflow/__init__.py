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
    "run_experiment": "trialflow.app.api",
    "ExperimentResult": "trialflow.app.api",
    "experiment_session": "trialflow.app.api",
    "resume_experiment": "trialflow.app.api",
    "stop_experiment": "trialflow.app.api",
    "kill_trial": "trialflow.app.api",
    "update_experiment": "trialflow.app.api",
    "update_search_space": "trialflow.app.api",
    "delete_experiment": "trialflow.app.api",
    "prefect_api": "trialflow.app.api",
    "UserError": "trialflow.foundation.user_errors",
    "ExperimentConfig": "trialflow.config",
    "ConfigError": "trialflow.config",
    "load_config": "trialflow.config",
    "parse_config": "trialflow.config",
}

# modules of the public API, by name: NNI's Python API (``nni.experiment`` re-exports it)
_MODULES = {"nni_python_api": "trialflow.app.nni_experiment"}

__all__ = ["__version__", *_EXPORTS, *_MODULES]


def __getattr__(name: str) -> Any:
    import importlib

    if name in _MODULES:
        return importlib.import_module(_MODULES[name])
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'trialflow' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
