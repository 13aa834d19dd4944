"""The ``adl`` section: AdaptDL jobs, with NNI's NFS and checkpoint settings."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .._base import ConfigModel, ConfigPath
from .base import DEFAULT_IMAGE, LOCAL_MOUNT_HELP
from .k8s import KubernetesSection


class AdlNfs(ConfigModel):
    server: str
    path: str
    container_mount_path: str
    local_mount_point: ConfigPath | None = Field(default=None, description=LOCAL_MOUNT_HELP)


class AdlCheckpoint(ConfigModel):
    storage_class: str
    storage_size: str


class AdlConfig(KubernetesSection):
    """AdaptDL; NNI only accepted it through v1 files, trialflow also takes it as a v2 section."""

    platform: Literal["adl"] = "adl"
    dump_order = ("image", "namespace", "image_pull_secrets", "nfs", "adaptive", "checkpoint", "cpu_number",
                  "memory_size", "log_collection", "credentials", "metric_channel")
    image: str = DEFAULT_IMAGE
    image_pull_secrets: list[dict[str, str]] | None = None
    nfs: AdlNfs | None = None
    adaptive: bool = False
    checkpoint: AdlCheckpoint | None = None
    cpu_number: float | None = Field(default=None, gt=0)
    memory_size: str | None = None
    log_collection: Literal["http", "none"] = "none"
