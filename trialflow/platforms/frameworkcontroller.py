"""FrameworkController training service: each trial (or reuse environment) is a ``Framework``
(``frameworkcontroller.microsoft.com/v1``), shaped as NNI wrote it (docs/nni.md#platform-requests): one task
role per ``taskRoles`` entry, a frameworkbarrier init container, ``FB_<ROLE>_PORT`` variables and
``. /mnt/frameworkbarrier/injector.sh`` before the role's command. The first task role is the
primary one: its first task runs the trial. State table (docs/platforms.md#kubernetes):

==========================================================  ===================================
``status.state``                                             trial status
==========================================================  ===================================
(none yet), AttemptCreationPending, AttemptCreationRequested,  WAITING
AttemptPreparing
AttemptRunning, AttemptDeletionPending, AttemptDeletionRequested,  RUNNING
AttemptDeleting, AttemptCompleted
Completed, completion type Succeeded                        SUCCEEDED
Completed, completion type Failed                           FAILED (code -210, a stop nobody
                                                            asked for: SYS_CANCELED)
==========================================================  ===================================
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from ..blocks import KubernetesCredentials
from ..config.sections.frameworkcontroller import FrameworkControllerConfig
from .base import PlatformError, TrialStatus
from .k8s import KubernetesJobService, resources, storage_volume
from .k8s_api import k8s_id
from .mounted_share import MountedShare
from .platform_row import Platform

BARRIER_MOUNT = "/mnt/frameworkbarrier"
FIRST_PORT = 4000
STATES = {
    "AttemptCreationPending": TrialStatus.WAITING,
    "AttemptCreationRequested": TrialStatus.WAITING,
    "AttemptPreparing": TrialStatus.WAITING,
    "AttemptRunning": TrialStatus.RUNNING,
    "AttemptDeletionPending": TrialStatus.RUNNING,
    "AttemptDeletionRequested": TrialStatus.RUNNING,
    "AttemptDeleting": TrialStatus.RUNNING,
    "AttemptCompleted": TrialStatus.RUNNING,
}
STOP_REQUESTED = -210


def framework_state(obj: dict[str, Any]) -> tuple[TrialStatus, str | None]:
    status = obj.get("status") or {}
    state = status.get("state")
    if state != "Completed":
        return STATES.get(state or "", TrialStatus.WAITING), state
    completion = (status.get("attemptStatus") or {}).get("completionStatus") or {}
    kind = (completion.get("type") or {}).get("name")
    message = f"{completion.get('phrase')} (code {completion.get('code')}): {completion.get('diagnostics')}"
    if kind == "Succeeded":
        return TrialStatus.SUCCEEDED, message
    if completion.get("code") == STOP_REQUESTED:
        return TrialStatus.SYS_CANCELED, message
    return TrialStatus.FAILED, message


class FrameworkControllerTrainingService(KubernetesJobService[FrameworkControllerConfig]):
    platform = "frameworkcontroller"
    group = "frameworkcontroller.microsoft.com"
    plural = "frameworks"

    def __init__(self, config: FrameworkControllerConfig, experiment_dir: Any) -> None:
        # NNI's custom template (configPath): the user's Framework is the base of every job
        self.template: dict[str, Any] | None = None
        if config.config_path is not None:
            self.template = yaml.safe_load(Path(config.config_path).read_text(encoding="utf-8"))
            config.template_roles()
        super().__init__(config, experiment_dir)

    def make_storage(self) -> MountedShare:
        return MountedShare(self.config.storage.local_mount_point, self.mount_path,
                             "the frameworkcontroller storage")

    def _template_containers(self) -> dict[str, dict[str, Any]]:
        assert self.template is not None
        return {r["name"]: r["task"]["pod"]["spec"]["containers"][0] for r in self.template["spec"]["taskRoles"]}

    def roles(self) -> dict[str, str]:
        if self.template is not None:
            return {name: " ".join(map(str, c["command"])) for name, c in self._template_containers().items()}
        return {role.name: role.command for role in self.config.task_roles}

    def primary_gpus(self) -> int:
        if self.template is not None:
            container = next(iter(self._template_containers().values()))
            return int(((container.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu") or 0)
        return self.config.task_roles[0].gpu_number

    def job_name(self, kind: str, ident: str) -> str:
        if kind == "env":
            return f"nniexp{self.experiment_id}env{ident}"
        name = f"nniexp{self.experiment_id}trial{k8s_id(ident)}"
        if self.template is not None:  # NNI: the template's name after "xx"
            name += f"xx{(self.template.get('metadata') or {}).get('name', 'template')}".lower()
        return name

    def prepare_platform(self) -> None:
        self.create_shared_secrets([r.private_registry_auth_path for r in self.config.task_roles])

    def manifest(self, name: str, object_labels: dict[str, str], commands: dict[str, list[str]],
                 env: list[dict[str, Any]]) -> dict[str, Any]:
        if self.template is not None:
            return self._from_template(name, object_labels, commands, env)
        ports = " ".join(f"FB_{r.name.upper().replace('-', '_')}_PORT={FIRST_PORT + i}"
                         for i, r in enumerate(self.config.task_roles))
        task_roles = []
        for index, role in enumerate(self.config.task_roles):
            if role.name not in commands:
                continue
            command = " ".join(commands[role.name])
            pod_spec: dict[str, Any] = {
                "containers": [{
                    "name": "framework", "image": role.docker_image,
                    "command": ["sh", "-c", f"{ports} . {BARRIER_MOUNT}/injector.sh && exec {command}"], "env": env,
                    "volumeMounts": [{"name": "nni-vol", "mountPath": self.mount_path},
                                     {"name": "frameworkbarrier-volume", "mountPath": BARRIER_MOUNT}],
                    "resources": resources(role.cpu_number, role.memory_size, role.gpu_number),
                    "ports": [{"containerPort": FIRST_PORT + index}],
                }],
                "initContainers": [{"name": "frameworkbarrier", "image": "frameworkcontroller/frameworkbarrier",
                                    "volumeMounts": [{"name": "frameworkbarrier-volume",
                                                      "mountPath": BARRIER_MOUNT}]}],
                "restartPolicy": "OnFailure", "hostNetwork": False,
                "volumes": [storage_volume(self.config.storage, self.azure_secret_name()),
                            {"name": "frameworkbarrier-volume", "emptyDir": {}}],
                **self.config.pod_capacity(),
            }
            if self.config.service_account_name:
                pod_spec["serviceAccountName"] = self.config.service_account_name
            if role.private_registry_auth_path is not None:
                pod_spec["imagePullSecrets"] = [{"name": self.registry_secret_name()}]
            policy = role.framework_attempt_completion_policy
            task_roles.append({
                "name": role.name, "taskNumber": role.task_number,
                "frameworkAttemptCompletionPolicy": {"minFailedTaskCount": policy.min_failed_task_count,
                                                     "minSucceededTaskCount": policy.min_succeed_task_count},
                "task": {"retryPolicy": {"fancyRetryPolicy": False, "maxRetryCount": 0},
                         "pod": {"metadata": {"labels": dict(object_labels)}, "spec": pod_spec}},
            })
        return {"apiVersion": f"{self.group}/{self.version}", "kind": "Framework",
                "metadata": {"name": name, "namespace": self.namespace, "labels": object_labels},
                "spec": {"executionType": "Start", "retryPolicy": {"fancyRetryPolicy": False, "maxRetryCount": 0},
                         "taskRoles": task_roles}}

    def _from_template(self, name: str, object_labels: dict[str, str], commands: dict[str, list[str]],
                       env: list[dict[str, Any]]) -> dict[str, Any]:
        """The user's Framework with what trialflow owns filled in: name, namespace and labels, each
        role's command (its run script on the share), the metrics variables, and the share's volume
        (unless the template mounts one at the container mount point already)."""
        assert self.template is not None
        job = copy.deepcopy(self.template)
        meta = job.setdefault("metadata", {})
        meta.update(name=name, namespace=self.namespace, labels={**(meta.get("labels") or {}), **object_labels})
        for role in job["spec"]["taskRoles"]:
            pod = role["task"]["pod"]
            pod_meta = pod.setdefault("metadata", {})
            pod_meta["labels"] = {**(pod_meta.get("labels") or {}), **object_labels}
            spec, container = pod["spec"], pod["spec"]["containers"][0]
            spec.update(self.config.pod_capacity())  # the section's, over the template's
            container["command"] = commands.get(role["name"], container["command"])
            container["env"] = [*(container.get("env") or []), *env]
            mounts = container.setdefault("volumeMounts", [])
            if not any(m.get("mountPath") == self.mount_path for m in mounts):
                if self.config.storage.storage_type == "pvc" and not self.config.storage.claim_name:
                    raise PlatformError(f"the configPath template's task role {role['name']!r} mounts nothing at "
                                        f"{self.mount_path}: mount the PVC there, or set the storage's claimName")
                mounts.append({"name": "nni-vol", "mountPath": self.mount_path})
                spec.setdefault("volumes", []).append(storage_volume(self.config.storage, self.azure_secret_name()))
        return job

    def job_state(self, obj: dict[str, Any]) -> tuple[TrialStatus, str | None]:
        return framework_state(obj)

    def pod_selector(self, name: str) -> str:
        return f"FC_FRAMEWORK_NAME={name}"


PLATFORM = Platform(FrameworkControllerConfig, FrameworkControllerTrainingService, KubernetesCredentials, "kubernetes")
