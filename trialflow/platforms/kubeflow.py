"""Kubeflow training service: each trial (or reuse environment) is a TFJob or PyTorchJob of the
Kubeflow training-operator (``kubeflow.org/v1``), manifests as NNI wrote them (docs/nni.md#platform-requests).

Roles: ``tf-operator`` takes ``worker`` (the trial) and ``ps``; ``pytorch-operator`` takes
``master`` (the trial, when set) and ``worker``. Each replica runs ``sh <storage>/.../run_<role>.sh``;
the primary role's first replica runs the trial, the others run their role's command beside it.
State table (docs/platforms.md#kubernetes: the last condition whose status is True):

=============================  ==============
condition                      trial status
=============================  ==============
(none yet), Created            WAITING
Suspended                      WAITING
Running, Restarting            RUNNING
Succeeded                      SUCCEEDED
Failed                         FAILED
=============================  ==============

A restart after Kubernetes stopped the trial's pod (the operator creates a replica killed by a signal
again under ``restartPolicy: ExitCode``) is an interruption: the trial runs again as a job of its own,
while the replica created again runs nothing and fails (exit 1), so the job ends.
"""

from __future__ import annotations

from typing import Any

from ..blocks import KubernetesCredentials
from ..config.sections.kubeflow import KubeflowConfig, KubeflowRoleConfig
from .base import TrialStatus
from .k8s import KubernetesJobService, resources, storage_volume
from .k8s_api import k8s_id
from .mounted_share import MountedShare
from .platform_row import Platform

CONDITION_STATES = {
    "Created": TrialStatus.WAITING,
    "Suspended": TrialStatus.WAITING,
    "Running": TrialStatus.RUNNING,
    "Restarting": TrialStatus.RUNNING,
    "Succeeded": TrialStatus.SUCCEEDED,
    "Failed": TrialStatus.FAILED,
}


def condition_state(obj: dict[str, Any]) -> tuple[TrialStatus, str | None]:
    conditions = [c for c in ((obj.get("status") or {}).get("conditions") or []) if c.get("status") == "True"]
    if not conditions:
        return TrialStatus.WAITING, None
    last = conditions[-1]
    return CONDITION_STATES.get(last.get("type"), TrialStatus.WAITING), last.get("message")


class KubeflowTrainingService(KubernetesJobService[KubeflowConfig]):
    platform = "kubeflow"
    group = "kubeflow.org"

    def __init__(self, config: KubeflowConfig, experiment_dir: Any) -> None:
        self.pytorch = config.operator == "pytorch-operator"
        self.plural = "pytorchjobs" if self.pytorch else "tfjobs"
        self.kind = "PyTorchJob" if self.pytorch else "TFJob"
        self.version = config.api_version
        super().__init__(config, experiment_dir)

    def make_storage(self) -> MountedShare:
        return MountedShare(self.config.storage.local_mount_point, self.mount_path, "the kubeflow storage")

    def role_configs(self) -> dict[str, KubeflowRoleConfig]:
        c = self.config
        ordered = [("Master", c.master), ("Worker", c.worker)] if self.pytorch else [("Worker", c.worker), ("PS", c.ps)]
        return {name: role for name, role in ordered if role is not None}

    def roles(self) -> dict[str, str]:
        return {name: role.command for name, role in self.role_configs().items()}

    def primary_gpus(self) -> int:
        return next(iter(self.role_configs().values())).gpu_number

    def job_name(self, kind: str, ident: str) -> str:
        if kind == "env":
            return f"nniexp{self.experiment_id}env{ident}"
        return f"nni-exp-{self.experiment_id}-trial-{k8s_id(ident)}"

    def prepare_platform(self) -> None:
        self.create_shared_secrets([r.private_registry_auth_path for r in self.role_configs().values()])

    def manifest(self, name: str, object_labels: dict[str, str], commands: dict[str, list[str]],
                 env: list[dict[str, Any]]) -> dict[str, Any]:
        replica_specs = {}
        for role, config in self.role_configs().items():
            if role not in commands:
                continue
            pod_spec: dict[str, Any] = {
                "containers": [{
                    "name": "pytorch" if self.pytorch else "tensorflow", "image": config.docker_image,
                    "command": commands[role], "env": env,
                    "volumeMounts": [{"name": "nni-vol", "mountPath": self.mount_path}],
                    "resources": resources(config.cpu_number, config.memory_size, config.gpu_number),
                }],
                "volumes": [storage_volume(self.config.storage, self.azure_secret_name())],
                **self.config.pod_capacity(),
            }
            if config.private_registry_auth_path is not None:
                pod_spec["imagePullSecrets"] = [{"name": self.registry_secret_name()}]
            replica_specs[role] = {"replicas": config.replicas, "restartPolicy": "ExitCode",
                                   "template": {"metadata": {"labels": dict(object_labels)}, "spec": pod_spec}}
        key = "pytorchReplicaSpecs" if self.pytorch else "tfReplicaSpecs"
        return {"apiVersion": f"{self.group}/{self.version}", "kind": self.kind,
                "metadata": {"name": name, "namespace": self.namespace, "labels": object_labels},
                "spec": {key: replica_specs, "runPolicy": {"cleanPodPolicy": "Running"}}}

    def job_state(self, obj: dict[str, Any]) -> tuple[TrialStatus, str | None]:
        return condition_state(obj)

    def restart_message(self, obj: dict[str, Any]) -> str | None:
        """``restartPolicy: ExitCode`` (NNI's): a replica killed by a signal is created again in place,
        and the job keeps a Restarting condition (True while it restarts, False after)."""
        restarts = [c for c in ((obj.get("status") or {}).get("conditions") or []) if c.get("type") == "Restarting"]
        return str(restarts[-1].get("message") or "Restarting") if restarts else None

    def pod_selector(self, name: str) -> str:
        return f"training.kubeflow.org/job-name={name}"


PLATFORM = Platform(KubeflowConfig, KubeflowTrainingService, KubernetesCredentials, "kubernetes")
