"""NNI's Python config objects (``nni.experiment.ExperimentConfig``, ``AlgorithmConfig``, ``LocalConfig``,
``RemoteConfig``, ...): fields set by their snake_case names, as NNI's Python API and its notebooks set
them, turned into the v2 config mapping (camelCase keys) that :func:`trialflow.config.parse_config`
checks.

An object holds what was set on it and nothing else; :meth:`ConfigObject.json` gives the mapping, with
nested objects turned too and the values of mappings (``search_space``, ``class_args``) as written. A
field NNI has no name for is not refused here: ``parse_config`` names it, with every other problem, when
the experiment starts. ``ExperimentConfig('local')`` makes the empty training service and algorithm
placeholders NNI makes, so that ``config.tuner.name = 'TPE'`` and
``config.tuner.class_args['optimize_mode'] = 'maximize'`` work on a new config; an algorithm left without
a name is left out.
"""

from __future__ import annotations

import os
import re
from typing import Any

__all__ = ["AlgorithmConfig", "AmlConfig", "AzureBlobConfig", "ConfigObject", "CustomAlgorithmConfig", "DlcConfig",
           "ExperimentConfig", "FrameworkAttemptCompletionPolicy", "FrameworkControllerConfig",
           "FrameworkControllerRoleConfig", "K8sAzureStorageConfig", "K8sNfsConfig", "K8sStorageConfig",
           "KubeflowConfig", "KubeflowRoleConfig", "LocalConfig", "NfsConfig", "OpenpaiConfig", "RemoteConfig",
           "RemoteMachineConfig", "SharedStorageConfig", "TrainingServiceConfig", "camel_case"]


_SECRET = re.compile(r"password|passphrase|secret|token|key$")  # a field whose value is a secret


def camel_case(name: str) -> str:
    """NNI's field name for a Python attribute: ``trial_gpu_number`` -> ``trialGpuNumber``."""
    first, *rest = name.strip("_").split("_")
    return first + "".join(word.title() for word in rest)


def _json_value(value: Any) -> Any:
    if isinstance(value, ConfigObject):
        return value.json()
    if isinstance(value, list | tuple):
        return [_json_value(item) for item in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value  # a mapping (search space, class args) stays as written


class ConfigObject:
    """Fields set as attributes (at construction as keyword arguments, or later one by one)."""

    def __init__(self, **fields: Any) -> None:
        for name, value in fields.items():
            setattr(self, name, value)

    def json(self) -> dict[str, Any]:
        """The v2 mapping: each field set and not None, under NNI's camelCase name."""
        out = {}
        for name, value in vars(self).items():
            if value is None or (isinstance(value, _Algorithm) and value.unnamed):
                continue
            out[camel_case(name)] = _json_value(value)
        return out

    def __repr__(self) -> str:
        """The fields as set, a secret's value (a password, passphrase, token or key) left out."""
        fields = ", ".join(f"{name}={'**********' if _SECRET.search(name) and value else repr(value)}"
                           for name, value in vars(self).items())
        return f"{type(self).__name__}({fields})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and vars(other) == vars(self)


class _Algorithm(ConfigObject):
    """A tuner, assessor or advisor section; one no one named (a placeholder) is left out."""

    @property
    def unnamed(self) -> bool:
        return getattr(self, "name", None) is None and getattr(self, "class_name", None) is None


class AlgorithmConfig(_Algorithm):
    """A built-in tuner, assessor or advisor: ``name`` and ``class_args``."""

    def __init__(self, name: str | None = None, class_args: dict[str, Any] | None = None, **fields: Any) -> None:
        super().__init__(name=name, class_args={} if class_args is None else class_args, **fields)


class CustomAlgorithmConfig(_Algorithm):
    """A customized tuner or assessor: ``class_name`` (``module.Class``), ``code_directory`` and
    ``class_args``."""

    def __init__(self, class_name: str | None = None, code_directory: str | os.PathLike[str] | None = ".",
                 class_args: dict[str, Any] | None = None, **fields: Any) -> None:
        super().__init__(class_name=class_name, code_directory=code_directory,
                         class_args={} if class_args is None else class_args, **fields)


class TrainingServiceConfig(ConfigObject):
    """A training service's section: ``platform`` and its fields."""

    def __init__(self, platform: str | None = None, **fields: Any) -> None:
        super().__init__(platform=platform, **fields)


class LocalConfig(TrainingServiceConfig):
    def __init__(self, **fields: Any) -> None:
        super().__init__("local", **fields)


class RemoteMachineConfig(ConfigObject):
    """One machine of a remote service: ``host``, ``user``, ``port``, ``ssh_key_file``, ..."""


class RemoteConfig(TrainingServiceConfig):
    """The remote service; ``machine_list`` starts empty for ``machine_list.append(RemoteMachineConfig(...))``."""

    def __init__(self, machine_list: list[RemoteMachineConfig] | None = None, **fields: Any) -> None:
        super().__init__("remote", machine_list=[] if machine_list is None else machine_list, **fields)


class _PlatformConfig(TrainingServiceConfig):
    """The section of the training service :attr:`PLATFORM` names."""

    PLATFORM = ""

    def __init__(self, **fields: Any) -> None:
        super().__init__(self.PLATFORM, **fields)


class OpenpaiConfig(_PlatformConfig):
    PLATFORM = "openpai"


class KubeflowConfig(_PlatformConfig):
    """Kubeflow's section: ``operator``, ``api_version``, ``storage`` (a :class:`K8sStorageConfig`) and
    the ``worker``, ``ps`` or ``master`` roles (:class:`KubeflowRoleConfig`)."""

    PLATFORM = "kubeflow"


class FrameworkControllerConfig(_PlatformConfig):
    """FrameworkController's section; ``task_roles`` starts empty for ``task_roles.append(...)``."""

    PLATFORM = "frameworkcontroller"

    def __init__(self, task_roles: list[Any] | None = None, **fields: Any) -> None:
        super().__init__(task_roles=[] if task_roles is None else task_roles, **fields)


class AmlConfig(_PlatformConfig):
    PLATFORM = "aml"


class DlcConfig(_PlatformConfig):
    PLATFORM = "dlc"


class KubeflowRoleConfig(ConfigObject):
    """A Kubeflow role: ``replicas``, ``command``, ``gpu_number``, ``cpu_number``, ``memory_size``, ..."""


class FrameworkControllerRoleConfig(ConfigObject):
    """A FrameworkController task role: ``name``, ``task_number``, ``command``, ...,
    ``framework_attempt_completion_policy``."""


class FrameworkAttemptCompletionPolicy(ConfigObject):
    """``min_failed_task_count`` and ``min_succeed_task_count`` of a task role."""


class _DefaultStorageType(ConfigObject):
    """A storage section whose ``storage_type`` is :attr:`STORAGE_TYPE` unless given."""

    STORAGE_TYPE = ""

    def __init__(self, storage_type: str | None = None, **fields: Any) -> None:
        super().__init__(storage_type=self.STORAGE_TYPE if storage_type is None else storage_type, **fields)


class K8sStorageConfig(ConfigObject):
    """The storage of a Kubernetes service: ``storage_type`` and its fields."""


class K8sNfsConfig(_DefaultStorageType, K8sStorageConfig):
    STORAGE_TYPE = "nfs"


class K8sAzureStorageConfig(_DefaultStorageType, K8sStorageConfig):
    STORAGE_TYPE = "azureStorage"


class SharedStorageConfig(ConfigObject):
    """The top-level ``shared_storage`` section (``storage_type``, ``local_mount_point``, ...)."""


class NfsConfig(_DefaultStorageType, SharedStorageConfig):
    STORAGE_TYPE = "NFS"


class AzureBlobConfig(_DefaultStorageType, SharedStorageConfig):
    STORAGE_TYPE = "AzureBlob"


_SERVICES: dict[str, type[TrainingServiceConfig]] = {
    "local": LocalConfig, "remote": RemoteConfig, **{c.PLATFORM: c for c in (
        OpenpaiConfig, KubeflowConfig, FrameworkControllerConfig, AmlConfig, DlcConfig)}}


def training_service_config(platform: str) -> TrainingServiceConfig:
    """An empty section for ``platform`` (NNI's ``training_service_config_factory``)."""
    made = _SERVICES.get(platform)
    return made() if made is not None else TrainingServiceConfig(platform)


class ExperimentConfig(ConfigObject):
    """An experiment's config. ``ExperimentConfig('local')`` (or a list of platforms, for a hybrid
    experiment) starts with an empty training service section and tuner, assessor and advisor
    placeholders; keyword arguments set fields as NNI's constructor does. A field of NNI's not set reads
    as NNI's default where trialflow's is the same, else None (the class attributes below), and is left
    out of :meth:`json`."""

    experiment_name: str | None = None
    experiment_type = "hpo"
    search_space_file: str | None = None
    search_space: Any = None
    trial_command: str | None = None
    trial_code_directory = "."
    trial_concurrency: int | None = None
    trial_gpu_number: int | None = None
    max_experiment_duration: str | int | None = None
    max_trial_number: int | None = None
    max_trial_duration: str | int | None = None
    nni_manager_ip: str | None = None
    use_annotation = False
    debug = False
    log_level: str | None = None
    experiment_working_directory: str | None = None  # trialflow's experiments home, not NNI's
    tuner_gpu_indices: Any = None
    tuner: Any = None
    assessor: Any = None
    advisor: Any = None
    training_service: Any = None
    shared_storage: Any = None

    def __init__(self, training_service_platform: str | list[str] | None = None, **fields: Any) -> None:
        super().__init__(**fields)
        if training_service_platform is None:
            return
        if isinstance(training_service_platform, list):
            self.training_service = [training_service_config(p) for p in training_service_platform]
        else:
            self.training_service = training_service_config(training_service_platform)
        for role in ("tuner", "assessor", "advisor"):
            if getattr(self, role, None) is None:
                setattr(self, role, AlgorithmConfig())
