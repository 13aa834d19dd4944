"""Experiment configuration: NNI's v2 schema (v1 files converted), validated with pydantic."""

from __future__ import annotations

from ._base import ConfigError, ConfigWarning, parse_duration, parse_gpu_indices, parse_size_mb
from .experiment import AlgorithmConfig, ExperimentConfig, convert_config_file, load_config, parse_config, warm_source
from .platforms import (
    PLATFORM_CONFIGS,
    AdlConfig,
    FrameworkControllerConfig,
    KubeflowConfig,
    KubeflowRoleConfig,
    LocalConfig,
    RemoteConfig,
    RemoteMachineConfig,
    TrainingServiceConfig,
)

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
