"""Kubernetes job platforms on the shared-storage base: the base of the kubeflow, frameworkcontroller
and adl services. A job is a custom object of the platform's CRD; the metrics token is a Secret the
pods reference (never written into the manifest); job logs are the pods' logs. Subclasses give the
manifest, the state table and the pod selector; Kubeflow and FrameworkController also create the
private registry and Azure File Secrets (:meth:`KubernetesJobService.create_shared_secrets`).
"""

from __future__ import annotations

from abc import abstractmethod
from pathlib import Path
from typing import Any, TypeVar

from ..config.sections.adaptdl import AdlConfig
from ..config.sections.frameworkcontroller import FrameworkControllerConfig
from ..config.sections.k8s import FrameworkStorageConfig, K8sStorageConfig
from ..config.sections.kubeflow import KubeflowConfig
from .base import TrialStatus
from .job_platform import JobPlatformService
from .job_platform_hooks import stopped_run
from .k8s_api import CONTAINER_MOUNT, LABEL_APP, KubeApi, azure_storage_key, labels, new_api_client

# Kubernetes' pod disruption conditions: a DisruptionTarget condition's reasons, and the reasons the
# kubelet and the node lifecycle controller give a pod they ended; each means the pod's node or the
# scheduler ended it, not its command
DISRUPTION_REASONS = {
    "PreemptionByScheduler": "was preempted by a higher-priority pod",
    "DeletionByTaintManager": "was deleted from a NoExecute-tainted node (node lost or drained)",
    "EvictionByEvictionAPI": "was evicted (a node drain or the cluster autoscaler)",
    "DeletionByPodGC": "was deleted with its node",
    "TerminationByKubelet": "was terminated by the kubelet (node pressure or shutdown)",
}
NODE_ENDED_REASONS = ("Evicted", "NodeLost", "NodeShutdown", "Shutdown", "Terminated", "UnexpectedAdmissionError")


def pod_disruption(pod: Any) -> str | None:
    """Why Kubernetes ended ``pod`` (a ``V1Pod``) apart from its command: a ``DisruptionTarget``
    condition that holds, or a Failed pod the kubelet or the node lifecycle ended; None otherwise."""
    status = pod.status
    if status is None:
        return None
    for condition in status.conditions or []:
        if condition.type == "DisruptionTarget" and condition.status == "True":
            text = DISRUPTION_REASONS.get(condition.reason or "", "was disrupted")
            return f"pod {pod.metadata.name} {text} ({_detail(condition.reason, condition.message)})"
    if status.phase == "Failed" and status.reason in NODE_ENDED_REASONS:
        return f"pod {pod.metadata.name} was ended by its node ({_detail(status.reason, status.message)})"
    return None


def _detail(reason: str | None, message: str | None) -> str:
    return f"{reason}: {message}" if message else str(reason)


# the Kubernetes family's configs: each has namespace and credentials
K8sConfigT = TypeVar("K8sConfigT", bound=KubeflowConfig | FrameworkControllerConfig | AdlConfig)


class KubernetesJobService(JobPlatformService[K8sConfigT]):
    group = ""
    version = "v1"
    plural = ""
    other_channels = "metricChannel: logs (or file, on the shared storage)"

    def __init__(self, config: K8sConfigT, experiment_dir: Path) -> None:
        self.namespace = config.namespace
        self._api: KubeApi | None = None
        super().__init__(config, experiment_dir)

    @property
    def mount_path(self) -> str:
        """Where pods mount the storage: the NFS storage's containerMountPoint (a top-level
        sharedStorage's remoteMountPoint), else trialflow's default."""
        return getattr(getattr(self.config, "storage", None), "container_mount_point", None) or CONTAINER_MOUNT

    # ---- what a Kubernetes platform implements --------------------------------------------------

    @abstractmethod
    def manifest(self, name: str, object_labels: dict[str, str], commands: dict[str, list[str]],
                 env: list[dict[str, Any]]) -> dict[str, Any]:
        """The job object; ``commands`` holds each role's container command."""

    @abstractmethod
    def job_state(self, obj: dict[str, Any]) -> tuple[TrialStatus, str | None]:
        """The platform's state table: the job object's status as a trial status and message."""

    @abstractmethod
    def pod_selector(self, name: str) -> str: ...

    def primary_gpus(self) -> int:
        """GPUs the primary role's pods ask for."""
        return 0

    def before_create(self, name: str, object_labels: dict[str, str], commands: dict[str, list[str]]) -> None:
        """Create objects the job needs besides its Secret (AdaptDL: PVC and ConfigMap)."""

    def after_delete(self, name: str) -> None:
        """Delete what ``before_create`` made."""

    # ---- the shared-storage base's job calls ----------------------------------------------------

    @property
    def api(self) -> KubeApi:
        if self._api is None:
            self._api = KubeApi(new_api_client(self.config.credentials), self.namespace)
        return self._api

    def check_platform(self) -> None:
        self.check_receiver_reachable()  # before any call: it needs only the configured address
        self.api.check_namespace()

    def platform_address(self) -> str:
        return str(self.api.host)

    def keeper_env(self, spec: Any) -> dict[str, str]:
        """The device plugin decides which GPUs a pod sees; only a role asking for none gets an empty
        ``CUDA_VISIBLE_DEVICES`` (as NNI did), so a GPU the pod was given is never hidden."""
        env = super().keeper_env(spec)
        if not self.primary_gpus():
            env["CUDA_VISIBLE_DEVICES"] = ""
        return env

    def handle_extra(self) -> dict[str, Any]:
        return {"namespace": self.namespace}

    def _metric_env(self, token_secret: str) -> list[dict[str, Any]]:
        url = self.metrics_url()
        if url is None:
            return []
        return [{"name": "TRIALFLOW_METRICS_URL", "value": url},
                {"name": "TRIALFLOW_METRICS_TOKEN",
                 "valueFrom": {"secretKeyRef": {"name": token_secret, "key": "token"}}}]

    def start_job(self, name: str, ids: dict[str, str], commands: dict[str, list[str]], token_ref: str) -> None:
        object_labels = labels(self.experiment_id, **ids)
        self.before_create(name, object_labels, commands)
        self.api.create_job(self.group, self.version, self.plural,
                            self.manifest(name, object_labels, commands, self._metric_env(token_ref)))

    def restart_message(self, obj: dict[str, Any]) -> str | None:
        """The operator's word that it is creating the job's failed replicas again, None otherwise
        (default: operators that never do)."""
        return None

    def job_status(self, name: str) -> tuple[TrialStatus, str | None] | None:
        obj = self.api.get_job(self.group, self.version, self.plural, name)
        self.note_restart(name, None if obj is None else self.restart_message(obj))
        return None if obj is None else self.job_state(obj)

    def delete_job(self, name: str) -> None:
        self.api.delete_job(self.group, self.version, self.plural, name)
        self.after_delete(name)

    def store_token(self, name: str, token: str, ids: dict[str, str]) -> str:
        return self.api.ensure_secret(name, {"token": token}, labels(self.experiment_id, **ids))["token"]

    def read_token(self, name: str) -> str | None:
        secret = self.api.read_secret(name)
        return secret.get("token") if secret else None

    def delete_token(self, name: str) -> None:
        self.api.delete("secret", name)

    def job_logs(self, name: str) -> dict[str, bytes]:
        return self.api.pod_logs(self.pod_selector(name))

    def job_interruption(self, name: str, state: dict[str, Any]) -> str | None:
        """A pod of the job that Kubernetes disrupted (:func:`pod_disruption`); else a trial run that
        a stop signal trialflow did not send ended, or that recorded no end in a job whose operator
        created its pod again (the kubelet stopped the pod; the disrupted object is gone)."""
        why = next((why for pod in self.api.pods(self.pod_selector(name)) if (why := pod_disruption(pod))), None)
        if why is None and (state.get("stop_signal") or (name in self._restarts and not state)):
            why = f"job {name}: Kubernetes stopped the trial's pod ({stopped_run(state)})" + \
                (f"; {self._restarts[name]}" if name in self._restarts else "")
        return why

    # ---- Secrets shared by an experiment's jobs (Kubeflow, FrameworkController) -------------------

    def _storage(self) -> K8sStorageConfig | FrameworkStorageConfig | None:
        """The config's ``storage`` section (Kubeflow, FrameworkController); None for AdaptDL (NFS only)."""
        return None if isinstance(self.config, AdlConfig) else self.config.storage

    def registry_secret_name(self) -> str:
        return f"nni-registry-{self.experiment_id}"

    def azure_secret_name(self) -> str | None:
        storage = self._storage()
        return f"nni-azure-{self.experiment_id}" if storage and storage.storage_type == "azureStorage" else None

    def create_shared_secrets(self, auth_paths: list[Any]) -> None:
        """The private registry Secret (the first role's auth file) and the Azure File share's key."""
        base = {"app": LABEL_APP, "expId": self.experiment_id}
        for path in auth_paths:
            if path is not None:
                self.api.ensure_secret(self.registry_secret_name(), {".dockerconfigjson": path.read_text()}, base,
                                       kind="kubernetes.io/dockerconfigjson")
                break
        storage = self._storage()
        if storage is not None and storage.storage_type == "azureStorage":
            key = azure_storage_key(storage.key_vault_name, storage.key_vault_key)
            self.api.ensure_secret(str(self.azure_secret_name()), {"azurestorageaccountname": storage.azure_account,
                                                                   "azurestorageaccountkey": key}, base)


def resources(cpu: float | None, memory_mb: int | str | None, gpus: int | None) -> dict[str, Any]:
    """A container's requests and limits in NNI's form (``<MB>Mi``; GPUs only when asked for)."""
    amounts: dict[str, str] = {}
    if cpu is not None:
        amounts["cpu"] = str(int(cpu)) if float(cpu).is_integer() else str(cpu)
    if memory_mb is not None:
        amounts["memory"] = f"{memory_mb}Mi" if isinstance(memory_mb, int) else str(memory_mb)
    if gpus:
        amounts["nvidia.com/gpu"] = str(gpus)
    return {"requests": dict(amounts), "limits": dict(amounts)}


def storage_volume(storage: Any, secret_name: str | None) -> dict[str, Any]:
    """The ``nni-vol`` volume of NNI's manifests: NFS, a PersistentVolumeClaim, or an Azure File share
    with its Secret."""
    if storage.storage_type == "nfs":
        return {"name": "nni-vol", "nfs": {"server": storage.server, "path": storage.path}}
    if storage.storage_type == "pvc":
        return {"name": "nni-vol", "persistentVolumeClaim": {"claimName": storage.claim_name}}
    return {"name": "nni-vol", "azureFile": {"secretName": secret_name, "shareName": storage.azure_share,
                                             "readOnly": False}}
