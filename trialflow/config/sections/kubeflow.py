"""The ``kubeflow`` section: a TFJob or PyTorchJob per trial (or per reuse environment), its roles."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from .._base import ConfigModel, ConfigPath, SizeMB
from .base import DEFAULT_IMAGE
from .k8s import K8sStorageConfig, KubernetesSection


class KubeflowRoleConfig(ConfigModel):
    replicas: int = Field(gt=0)
    command: str
    gpu_number: int = Field(default=0, ge=0)
    cpu_number: float = Field(gt=0)
    memory_size: SizeMB
    docker_image: str = DEFAULT_IMAGE
    code_directory: str | None = None
    private_registry_auth_path: ConfigPath | None = None


class KubeflowConfig(KubernetesSection):
    platform: Literal["kubeflow"] = "kubeflow"
    dump_order = ("operator", "api_version", "storage", "worker", "ps", "master", "namespace", "credentials",
                  "metric_channel")
    roles_carry_commands: ClassVar[bool] = True
    operator: Literal["tf-operator", "pytorch-operator"]
    api_version: Literal["v1alpha2", "v1beta1", "v1beta2", "v1"]
    storage: K8sStorageConfig
    worker: KubeflowRoleConfig | None = None
    ps: KubeflowRoleConfig | None = None
    master: KubeflowRoleConfig | None = None
    reuse_mode: bool = True

    @model_validator(mode="after")
    def _roles(self) -> KubeflowConfig:
        if self.worker is None:
            raise ValueError("worker must be set (the replica spec that runs the trial)")
        if self.operator == "tf-operator" and self.master is not None:
            raise ValueError("tf-operator takes worker and ps roles, not master")
        if self.operator == "pytorch-operator":
            if self.ps is not None:
                raise ValueError("pytorch-operator takes master and worker roles, not ps")
            if self.master is not None and self.master.replicas != 1:
                raise ValueError("pytorch-operator needs exactly one master replica")
        return self
