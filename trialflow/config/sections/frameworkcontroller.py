"""The ``frameworkcontroller`` section: a Framework per trial, from task roles or a template file."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import Field, model_validator

from .._base import ConfigModel, ConfigPath, SizeMB
from .base import DEFAULT_IMAGE
from .k8s import FrameworkStorageConfig, KubernetesSection


class CompletionPolicy(ConfigModel):
    min_failed_task_count: int
    min_succeed_task_count: int


class FrameworkControllerRoleConfig(ConfigModel):
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    docker_image: str = DEFAULT_IMAGE
    task_number: int = Field(gt=0)
    command: str
    gpu_number: int = Field(ge=0)
    cpu_number: float = Field(gt=0)
    memory_size: SizeMB
    framework_attempt_completion_policy: CompletionPolicy
    private_registry_auth_path: ConfigPath | None = None


class FrameworkControllerConfig(KubernetesSection):
    platform: Literal["frameworkcontroller"] = "frameworkcontroller"
    dump_order = ("storage", "service_account_name", "task_roles", "config_path", "namespace", "credentials",
                  "metric_channel")
    roles_carry_commands: ClassVar[bool] = True
    storage: FrameworkStorageConfig
    service_account_name: str | None = None
    task_roles: list[FrameworkControllerRoleConfig] = Field(default_factory=list)
    config_path: ConfigPath | None = Field(default=None, description="a Framework YAML to use as the job's template "
                                           "(NNI's frameworkcontrollerConfig.configPath): its task roles, images, "
                                           "resources and volumes are kept; trialflow sets names, labels, "
                                           "commands and its share")
    reuse_mode: bool = True

    @model_validator(mode="after")
    def _roles_or_template(self) -> FrameworkControllerConfig:
        if self.config_path is None:
            if not self.task_roles:
                raise ValueError("taskRoles needs at least one role (or give configPath: a Framework template)")
            if self.storage.storage_type == "pvc" and not self.storage.claim_name:
                raise ValueError("pvc storage needs claimName (the claim trialflow mounts in the pods), or a "
                                 "configPath template that mounts it")
            return self
        if self.task_roles:
            raise ValueError("give taskRoles or configPath (a Framework template), not both")
        if self.reuse_mode:
            raise ValueError("configPath (a custom Framework template) works with reuseMode: false, as in NNI")
        self.template_roles()  # the template is checked when the config is loaded
        return self

    def template_roles(self) -> list[dict[str, Any]]:
        """The task roles of the ``configPath`` template, checked: a Framework with task roles of one
        (non-init) container each that has a command."""
        assert self.config_path is not None
        path = Path(self.config_path)
        try:
            template = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as exc:
            raise ValueError(f'configPath "{path}" cannot be read as YAML: {exc}') from None
        if not isinstance(template, dict) or template.get("kind") != "Framework":
            raise ValueError(f'configPath "{path}" is not a Framework (kind: Framework)')
        roles = (template.get("spec") or {}).get("taskRoles") or []
        if not roles:
            raise ValueError(f'configPath "{path}": spec.taskRoles has no role')
        for i, role in enumerate(roles):
            containers = ((((role or {}).get("task") or {}).get("pod") or {}).get("spec") or {}).get("containers")
            if not role.get("name") or not isinstance(containers, list) or len(containers) != 1:
                raise ValueError(f'configPath "{path}": spec.taskRoles[{i}] needs a name and exactly one container '
                                 "in task.pod.spec.containers")
            if not containers[0].get("command"):
                raise ValueError(f'configPath "{path}": spec.taskRoles[{i}] ({role["name"]}): its container has no '
                                 "command")
        return [dict(r) for r in roles]
