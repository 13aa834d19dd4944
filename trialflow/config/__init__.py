"""Experiment configuration: NNI's v2 schema (v1 files converted), validated with pydantic.

The ``trainingService`` union is :mod:`.platforms`; each built-in platform's section model is
``sections/<name>.py``, named as its service module ``trialflow.platforms.<name>``, on the shared bases of
``sections/base.py`` (every section), ``sections/ssh.py`` (an SSH login) and ``sections/k8s.py`` (the
Kubernetes sections). Every name loads at its first use, so a module that needs one section does not
load the algorithm tables the experiment model checks against.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from .sections.adaptdl import AdlConfig
    from .sections.base import TrainingServiceConfig
    from .sections.frameworkcontroller import FrameworkControllerConfig
    from .sections.kubeflow import KubeflowConfig, KubeflowRoleConfig
    from .sections.local import LocalConfig
    from .sections.remote import RemoteConfig, RemoteMachineConfig

_WHERE = {
    "ConfigError": "._base", "ConfigWarning": "._base", "parse_duration": "._base", "parse_gpu_indices": "._base",
    "parse_size_mb": "._base", "AlgorithmConfig": ".experiment", "ExperimentConfig": ".experiment",
    "convert_config_file": ".experiment", "load_config": ".experiment", "parse_config": ".experiment",
    "warm_source": ".experiment", "PLATFORM_CONFIGS": ".platforms", "AdlConfig": ".sections.adaptdl",
    "TrainingServiceConfig": ".sections.base",
    "FrameworkControllerConfig": ".sections.frameworkcontroller",
    "KubeflowConfig": ".sections.kubeflow", "KubeflowRoleConfig": ".sections.kubeflow",
    "LocalConfig": ".sections.local", "RemoteConfig": ".sections.remote",
    "RemoteMachineConfig": ".sections.remote",
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
