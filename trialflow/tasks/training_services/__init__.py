"""Registry of training services: platform name -> service factory (one line per platform)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ...config import TrainingServiceConfig
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


def _local(config: TrainingServiceConfig, experiment_dir: Path) -> TrainingService:
    from .local import LocalTrainingService

    return LocalTrainingService(config, experiment_dir)  # type: ignore[arg-type]


def _remote(config: TrainingServiceConfig, experiment_dir: Path) -> TrainingService:
    from .remote import RemoteTrainingService

    return RemoteTrainingService(config, experiment_dir)  # type: ignore[arg-type]


def _kubeflow(config: TrainingServiceConfig, experiment_dir: Path) -> TrainingService:
    from .kubeflow import KubeflowTrainingService

    return KubeflowTrainingService(config, experiment_dir)  # type: ignore[arg-type]


def _frameworkcontroller(config: TrainingServiceConfig, experiment_dir: Path) -> TrainingService:
    from .frameworkcontroller import FrameworkControllerTrainingService

    return FrameworkControllerTrainingService(config, experiment_dir)  # type: ignore[arg-type]


def _adl(config: TrainingServiceConfig, experiment_dir: Path) -> TrainingService:
    from .adaptdl import AdaptDLTrainingService

    return AdaptDLTrainingService(config, experiment_dir)  # type: ignore[arg-type]


SERVICES: dict[str, Callable[[TrainingServiceConfig, Path], TrainingService]] = {
    "local": _local,
    "remote": _remote,
    "kubeflow": _kubeflow,
    "frameworkcontroller": _frameworkcontroller,
    "adl": _adl,
}


def create_service(config: TrainingServiceConfig, experiment_dir: Path) -> TrainingService:
    factory = SERVICES.get(config.platform)
    if factory is None:
        raise PlatformError(f"the {config.platform!r} training service is not available in this version of "
                            f"trialflow; available: {', '.join(SERVICES)}")
    return factory(config, experiment_dir)


__all__ = ["SERVICES", "CodeRef", "LostHandleError", "PlatformError", "TrainingService", "TransientPlatformError",
           "TrialHandle", "TrialSpec", "TrialStatus", "TrialUpdate", "create_service"]
