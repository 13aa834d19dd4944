"""What the Kubernetes sections (``kubeflow``, ``frameworkcontroller``, ``adl``) share: their storage
kinds, where pods may run (cheap capacity) and the section fields of every Kubernetes platform.
Config layer: pydantic only."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, field_validator

from .._base import ConfigModel, ConfigPath, OrderedDump, canonical_key
from .base import LOCAL_MOUNT_HELP, POD_CHANNEL_HELP, MetricChannel, TrainingServiceConfig


class NfsStorage(ConfigModel):
    storage_type: Literal["nfs"] = "nfs"
    server: str
    path: str
    local_mount_point: ConfigPath | None = Field(default=None, description=LOCAL_MOUNT_HELP)
    container_mount_point: str | None = Field(default=None, description="where pods mount it (default /tmp/mount; "
                                              "a top-level sharedStorage's remoteMountPoint)")


class AzureStorage(ConfigModel):
    storage_type: Literal["azureStorage"] = "azureStorage"
    azure_account: str
    azure_share: str
    key_vault_name: str
    key_vault_key: str
    local_mount_point: ConfigPath | None = Field(default=None, description=LOCAL_MOUNT_HELP)


class PvcStorage(ConfigModel):
    """A PersistentVolumeClaim (NNI's ``storage: pvc``, FrameworkController only): ``path`` is where
    this machine sees the claim's volume; pods mount it at the container mount point, through
    ``claimName`` or through a custom Framework template (``configPath``) that mounts it itself."""

    storage_type: Literal["pvc"] = "pvc"
    path: ConfigPath = Field(description="where this machine sees the claim's volume (NNI's pvc.path)")
    claim_name: str | None = Field(default=None, description="the claim trialflow mounts in the pods; leave it "
                                   "out when the configPath template mounts the volume itself")

    @property
    def local_mount_point(self) -> Any:
        return self.path


def _storage_tag(value: Any) -> str | None:
    if isinstance(value, dict):
        for key, tag in value.items():
            if canonical_key(str(key)) == "storagetype":
                return {"nfs": "~nfs", "azurestorage": "~azureStorage", "pvc": "~pvc"}.get(str(tag).lower(), str(tag))
        return "~nfs"
    kind = getattr(value, "storage_type", None)
    return f"~{kind}" if kind else None


K8sStorageConfig = Annotated[
    Annotated[NfsStorage, Tag("~nfs")] | Annotated[AzureStorage, Tag("~azureStorage")],
    Discriminator(
        _storage_tag,
        custom_error_type="storage_type",
        custom_error_message='storageType must be "nfs" or "azureStorage"',
    ),
]
FrameworkStorageConfig = Annotated[
    Annotated[NfsStorage, Tag("~nfs")] | Annotated[AzureStorage, Tag("~azureStorage")]
    | Annotated[PvcStorage, Tag("~pvc")],
    Discriminator(
        _storage_tag,
        custom_error_type="storage_type",
        custom_error_message='storageType must be "nfs", "azureStorage" or "pvc"',
    ),
]


TOLERATION_KEYS = frozenset({"key", "operator", "value", "effect", "tolerationSeconds"})


class KubernetesCapacity(ConfigModel):
    """Where a Kubernetes section's pods may run and how readily they yield, in Kubernetes' own terms:
    cheap capacity. A pod on it that is preempted or evicted is an interruption (``maxInterruptions``),
    not the trial's failure."""

    priority_class_name: str | None = Field(
        default=None, min_length=1, description="the pods' PriorityClass: a low one lets higher-priority pods "
        "preempt trials, each preemption an interruption")
    tolerations: list[dict[str, Any]] | None = Field(
        default=None, description="the pods' tolerations, e.g. of a spot node pool's taint "
        "({key: ..., operator: Exists, effect: NoSchedule})")
    node_selector: dict[str, str] | None = Field(default=None, description="node labels the pods must run on "
                                                                           "(e.g. a spot node pool's)")

    @field_validator("tolerations")
    @classmethod
    def _toleration_keys(cls, value: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for i, toleration in enumerate(value or []):
            unknown = sorted(set(toleration) - TOLERATION_KEYS)
            if unknown:
                raise ValueError(f"tolerations[{i}] has {', '.join(unknown)}; a toleration takes "
                                 f"{', '.join(sorted(TOLERATION_KEYS))}")
        return value

    def pod_capacity(self) -> dict[str, Any]:
        """The pod spec fields these settings give (none when unset)."""
        fields = {"priorityClassName": self.priority_class_name, "tolerations": self.tolerations,
                  "nodeSelector": self.node_selector}
        return {k: v for k, v in fields.items() if v is not None}


class KubernetesSection(TrainingServiceConfig, KubernetesCapacity, OrderedDump):
    """The fields of every Kubernetes platform's section: its namespace, its credentials block (default:
    the kubeconfig) and the metric channel; each platform's ``dump_order`` places them among its own."""

    namespace: str = "default"
    credentials: str | None = Field(default=None, description="name of a Kubernetes credentials block")
    metric_channel: MetricChannel = Field(default="http", description=POD_CHANNEL_HELP)
