"""Training platforms: plain Python (no Prefect tasks or flows), one module per platform, behind the
one interface of :mod:`.base`, its config section named as it (``trialflow.config.sections.<name>``).
:mod:`.table` is the platform table; :mod:`.trialdir` the controller's side of the trial file protocol;
:mod:`.job_platform` the base of job platforms on a mounted share."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from .errors import RetryPolicy, is_transient
    from .hybrid import experiment_retry, experiment_service
    from .platform_row import Platform
    from .table import PLATFORMS, available, create_service, platform

# Every name loads at its first use: a module of one platform (``create``'s GPU check of a local section)
# comes without the table and the hybrid service, which import every platform's credentials block, hence
# Prefect.
_BASE = ("CodeRef", "LostHandleError", "PlatformError", "TrainingService", "TransientPlatformError", "TrialHandle",
         "TrialSpec", "TrialStatus", "TrialUpdate", "service_name")
_LAZY = {name: "base" for name in _BASE} | {
    "is_transient": "errors", "RetryPolicy": "errors", "Platform": "platform_row", "experiment_retry": "hybrid",
    "experiment_service": "hybrid", "PLATFORMS": "table", "available": "table", "create_service": "table",
    "platform": "table"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = globals()[name] = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    return value


__all__ = ["PLATFORMS", "CodeRef", "LostHandleError", "Platform", "PlatformError", "RetryPolicy", "TrainingService",
           "TransientPlatformError", "TrialHandle", "TrialSpec", "TrialStatus", "TrialUpdate", "available",
           "create_service", "experiment_retry", "experiment_service", "is_transient", "platform", "service_name"]
