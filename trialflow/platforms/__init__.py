"""Training platforms: plain Python (no Prefect tasks or flows), one module per platform, behind the
one interface of :mod:`.base`. :mod:`.table` is the platform table; :mod:`.trialdir` the controller's
side of the trial file protocol; :mod:`.job_platform` the base of job platforms on a mounted share."""

from __future__ import annotations

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
)
from .errors import is_transient
from .hybrid import experiment_retry, experiment_service, service_name
from .table import PLATFORMS, Platform, RetryPolicy, available, create_service, platform

__all__ = ["PLATFORMS", "CodeRef", "LostHandleError", "Platform", "PlatformError", "RetryPolicy", "TrainingService",
           "TransientPlatformError", "TrialHandle", "TrialSpec", "TrialStatus", "TrialUpdate", "available",
           "create_service", "experiment_retry", "experiment_service", "is_transient", "platform", "service_name"]
