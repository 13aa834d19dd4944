"""Training platforms: plain Python (no Prefect tasks or flows), one module per platform, behind the
one interface of :mod:`.base`. :mod:`.table` is the platform table; :mod:`.trialdir` the controller's
side of the trial file protocol; :mod:`.job_platform` the base of job platforms on a mounted share."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .base import (
    CodeRef,
    LostHandleError,
    PlatformError,
    TrainingService,
    TransientPlatformError,
    TrialHandle,
    TrialSpec,
    TrialStatus,
    TrialUpdate,
    service_name,
)
from .errors import is_transient

if TYPE_CHECKING:
    from .hybrid import experiment_retry, experiment_service
    from .table import PLATFORMS, Platform, RetryPolicy, available, create_service, platform

# The table and the hybrid service import every platform's credentials block, hence Prefect: they load
# at the first use of one of their names, so that a module of one platform (``create``'s GPU check of a
# local section) is imported without them.
_LAZY = {"experiment_retry": "hybrid", "experiment_service": "hybrid", "PLATFORMS": "table", "Platform": "table",
         "RetryPolicy": "table", "available": "table", "create_service": "table", "platform": "table"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)


__all__ = ["PLATFORMS", "CodeRef", "LostHandleError", "Platform", "PlatformError", "RetryPolicy", "TrainingService",
           "TransientPlatformError", "TrialHandle", "TrialSpec", "TrialStatus", "TrialUpdate", "available",
           "create_service", "experiment_retry", "experiment_service", "is_transient", "platform", "service_name"]
