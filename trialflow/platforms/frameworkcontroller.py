"""FrameworkController training service: each trial (or reuse environment) is a ``Framework``
(``frameworkcontroller.microsoft.com/v1``), shaped as NNI wrote it (nni-contract.md §5.2): one task
role per ``taskRoles`` entry, a frameworkbarrier init container, ``FB_<ROLE>_PORT`` variables and
``. /mnt/frameworkbarrier/injector.sh`` before the role's command. The first task role is the
primary one: its first task runs the trial. State table (platforms.md §1.2):

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

from typing import Any

from ..config import FrameworkControllerConfig
from .base import TrialStatus
from .k8s import KubernetesJobService, resources, storage_volume
from .k8s_api import CONTAINER_MOUNT, k8s_id
from .shared_storage import SharedStorage

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


class FrameworkControllerTrainingService(KubernetesJobService):
    platform = "frameworkcontroller"
    group = "frameworkcontroller.microsoft.com"
    plural = "frameworks"

    def __init__(self, config: FrameworkControllerConfig, experiment_dir: Any) -> None:
        super().__init__(config, experiment_dir)

    def make_storage(self) -> SharedStorage:
        return SharedStorage(self.config.storage.local_mount_point, CONTAINER_MOUNT,
                             "the frameworkcontroller storage")

    def roles(self) -> dict[str, str]:
        return {role.name: role.command for role in self.config.task_roles}

    def primary_gpus(self) -> int:
        return self.config.task_roles[0].gpu_number

    def job_name(self, kind: str, ident: str) -> str:
        if kind == "env":
            return f"nniexp{self.experiment_id}env{ident}"
        return f"nniexp{self.experiment_id}trial{k8s_id(ident)}"

    def prepare_platform(self) -> None:
        self.create_shared_secrets([r.private_registry_auth_path for r in self.config.task_roles])

    def manifest(self, name: str, object_labels: dict[str, str], commands: dict[str, list[str]],
                 env: list[dict[str, Any]]) -> dict[str, Any]:
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
                    "command": ["sh", "-c", f"{ports} . {BARRIER_MOUNT}/injector.sh && {command}"], "env": env,
                    "volumeMounts": [{"name": "nni-vol", "mountPath": CONTAINER_MOUNT},
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

    def job_state(self, obj: dict[str, Any]) -> tuple[TrialStatus, str | None]:
        return framework_state(obj)

    def pod_selector(self, name: str) -> str:
        return f"FC_FRAMEWORK_NAME={name}"
