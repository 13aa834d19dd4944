"""Experiment configuration: NNI's v2 schema (v1 files converted), validated with pydantic.

Every name loads at its first use: a platform's section model (``trialflow.platforms.<name>_config``)
builds on this package's shared machinery (``_base``) while the config's union is built from the
section models, so importing the package itself imports neither.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..platforms.adaptdl_config import AdlConfig
    from ..platforms.base_config import TrainingServiceConfig
    from ..platforms.frameworkcontroller_config import FrameworkControllerConfig
    from ..platforms.kubeflow_config import KubeflowConfig, KubeflowRoleConfig
    from ..platforms.local_config import LocalConfig
    from ..platforms.remote_config import RemoteConfig, RemoteMachineConfig
    from ._base import ConfigError, ConfigWarning, parse_duration, parse_gpu_indices, parse_size_mb
    from .experiment import (
        AlgorithmConfig,
        ExperimentConfig,
        convert_config_file,
        load_config,
        parse_config,
        warm_source,
    )
    from .platforms import PLATFORM_CONFIGS

_WHERE = {
    "ConfigError": "._base", "ConfigWarning": "._base", "parse_duration": "._base", "parse_gpu_indices": "._base",
    "parse_size_mb": "._base", "AlgorithmConfig": ".experiment", "ExperimentConfig": ".experiment",
    "convert_config_file": ".experiment", "load_config": ".experiment", "parse_config": ".experiment",
    "warm_source": ".experiment", "PLATFORM_CONFIGS": ".platforms", "AdlConfig": "..platforms.adaptdl_config",
    "TrainingServiceConfig": "..platforms.base_config",
    "FrameworkControllerConfig": "..platforms.frameworkcontroller_config",
    "KubeflowConfig": "..platforms.kubeflow_config", "KubeflowRoleConfig": "..platforms.kubeflow_config",
    "LocalConfig": "..platforms.local_config", "RemoteConfig": "..platforms.remote_config",
    "RemoteMachineConfig": "..platforms.remote_config",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = globals()[name] = getattr(importlib.import_module(_WHERE[name], __name__), name)
    return value


__all__ = [
    "ConfigWarning",
    "PLATFORM_CONFIGS",
    "AdlConfig",
    "AlgorithmConfig",
    "FrameworkControllerConfig",
    "KubeflowConfig",
    "KubeflowRoleConfig",
    "ConfigError",
    "ExperimentConfig",
    "LocalConfig",
    "RemoteConfig",
    "RemoteMachineConfig",
    "TrainingServiceConfig",
    "convert_config_file",
    "load_config",
    "parse_config",
    "parse_duration",
    "parse_gpu_indices",
    "parse_size_mb",
    "warm_source",
]
