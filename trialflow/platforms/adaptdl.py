"""AdaptDL training service (``platform: adl``): each trial is an ``AdaptDLJob``
(``adaptdl.petuum.com/v1``) shaped as NNI 2.x wrote it (docs/nni.md#platform-requests): container ``main``
running ``run.sh`` from a per-trial ConfigMap (mode 0777, with ``cleanup.sh`` as the preStop hook),
``ADAPTDL_CHECKPOINT_PATH`` / ``ADAPTDL_SHARE_PATH`` / ``ADAPTDL_TENSORBOARD_LOGDIR``,
``spec.preemptible`` from ``adaptive``, and with ``checkpoint`` a ReadWriteMany PVC named like the
job. Code, parameters and trial files travel through the ``nfs`` share (required: it is where
trialflow puts them), mounted at ``nfs.containerMountPath``. NNI's per-experiment TensorBoard
Deployment is not created. There is no reuse mode (NNI had none for AdaptDL). State table
(docs/platforms.md#kubernetes, ``status.phase``):

=================================  ===================================================
phase                              trial status
=================================  ===================================================
(none yet), Pending, Starting      WAITING (reason ImagePullBackOff/ErrImagePull: FAILED)
Running, Stopping                  RUNNING (Stopping is a rescale)
Succeeded                          SUCCEEDED
Failed                             FAILED
=================================  ===================================================
"""

from __future__ import annotations

from typing import Any

from ..blocks import KubernetesCredentials
from ..config.sections.adaptdl import AdlConfig
from .base import PlatformError, TrialStatus
from .k8s import KubernetesJobService, resources
from .k8s_api import k8s_id
from .mounted_share import MountedShare
from .platform_row import Platform

PHASES = {"Pending": TrialStatus.WAITING, "Starting": TrialStatus.WAITING, "Running": TrialStatus.RUNNING,
          "Stopping": TrialStatus.RUNNING, "Succeeded": TrialStatus.SUCCEEDED, "Failed": TrialStatus.FAILED}
IMAGE_ERRORS = ("ImagePullBackOff", "ErrImagePull")
SCRIPTS_MOUNT = "/trialflow-scripts"


def adaptdl_state(obj: dict[str, Any]) -> tuple[TrialStatus, str | None]:
    status = obj.get("status") or {}
    phase, reason = status.get("phase"), status.get("reason")
    message = " ".join(str(p) for p in (phase, reason, status.get("message")) if p) or None
    if reason in IMAGE_ERRORS:
        return TrialStatus.FAILED, message
    return PHASES.get(phase or "", TrialStatus.WAITING), message


class AdaptDLTrainingService(KubernetesJobService[AdlConfig]):
    platform = "adl"
    group = "adaptdl.petuum.com"
    plural = "adaptdljobs"
    reuse_supported = False

    def __init__(self, config: AdlConfig, experiment_dir: Any) -> None:
        super().__init__(config, experiment_dir)

    def make_storage(self) -> MountedShare:
        nfs = self.config.nfs
        if nfs is None:
            raise PlatformError("adl needs an nfs section (server, path, containerMountPath, localMountPoint): "
                                "trialflow delivers code and parameters through it")
        return MountedShare(nfs.local_mount_point, nfs.container_mount_path, "the adl nfs share")

    def roles(self) -> dict[str, str]:
        return {"main": self.config.trial_command}

    def primary_gpus(self) -> int:
        return self.config.trial_gpu_number or 0

    def job_name(self, kind: str, ident: str) -> str:
        return f"nni-exp-{self.experiment_id}-trial-{k8s_id(ident)}"

    def before_create(self, name: str, object_labels: dict[str, str], commands: dict[str, list[str]]) -> None:
        self.api.ensure("configmap", {
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": object_labels},
            "data": {"run.sh": '#!/bin/sh\nexec sh "$TRIALFLOW_TRIAL_SCRIPT"\n',
                     "cleanup.sh": "#!/bin/sh\nkill -INT 1 2>/dev/null; sleep 2\n"}})
        checkpoint = self.config.checkpoint
        if checkpoint is not None:
            self.api.ensure("pvc", {
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": name, "labels": object_labels},
                "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": checkpoint.storage_class,
                         "resources": {"requests": {"storage": checkpoint.storage_size}}}})

    def after_delete(self, name: str) -> None:
        self.api.delete("configmap", name)
        if self.config.checkpoint is not None:
            self.api.delete("pvc", name)

    def manifest(self, name: str, object_labels: dict[str, str], commands: dict[str, list[str]],
                 env: list[dict[str, Any]]) -> dict[str, Any]:
        c = self.config
        mounts = [{"name": "nni-nfs", "mountPath": self.storage.container},
                  {"name": "scripts", "mountPath": SCRIPTS_MOUNT}]
        volumes: list[dict[str, Any]] = [
            {"name": "nni-nfs", "nfs": {"server": c.nfs.server, "path": c.nfs.path}},  # type: ignore[union-attr]
            {"name": "scripts", "configMap": {"name": name, "defaultMode": 511}}]
        if c.checkpoint is not None:
            mounts += [{"name": "checkpoint", "mountPath": "/adaptdl/checkpoint", "subPath": "adaptdl/checkpoint"},
                       {"name": "checkpoint", "mountPath": "/adaptdl/share", "subPath": "adaptdl/share"}]
            volumes.append({"name": "checkpoint", "persistentVolumeClaim": {"claimName": name}})
        res = resources(c.cpu_number or 1, c.memory_size or "1Gi", None)
        if c.trial_gpu_number:
            res["limits"]["nvidia.com/gpu"] = str(c.trial_gpu_number)
        pod_spec: dict[str, Any] = {
            "containers": [{
                "name": "main", "image": c.image, "imagePullPolicy": "Always",
                "command": ["sh", f"{SCRIPTS_MOUNT}/run.sh"],
                "lifecycle": {"preStop": {"exec": {"command": ["sh", f"{SCRIPTS_MOUNT}/cleanup.sh"]}}},
                "env": [{"name": "ADAPTDL_CHECKPOINT_PATH", "value": "/adaptdl/checkpoint"},
                        {"name": "ADAPTDL_TENSORBOARD_LOGDIR", "value": "/adaptdl/tensorboard"},
                        {"name": "ADAPTDL_SHARE_PATH", "value": "/adaptdl/share"},
                        {"name": "TRIALFLOW_TRIAL_SCRIPT", "value": commands["main"][-1]}, *env],
                "volumeMounts": mounts, "resources": res}],
            "volumes": volumes,
            **c.pod_capacity(),
        }
        if c.image_pull_secrets:
            pod_spec["imagePullSecrets"] = c.image_pull_secrets
        return {"apiVersion": f"{self.group}/{self.version}", "kind": "AdaptDLJob",
                "metadata": {"name": name, "namespace": self.namespace, "labels": object_labels},
                "spec": {"preemptible": c.adaptive,
                         "template": {"metadata": {"labels": dict(object_labels)}, "spec": pod_spec}}}

    def job_state(self, obj: dict[str, Any]) -> tuple[TrialStatus, str | None]:
        return adaptdl_state(obj)

    def pod_selector(self, name: str) -> str:
        return f"adaptdl/job={name}"


PLATFORM = Platform(AdlConfig, AdaptDLTrainingService, KubernetesCredentials, "kubernetes")
