"""The ``dlc`` section: Alibaba PAI-DLC jobs, their NAS data source and AccessKey."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from .._base import ConfigPath
from .base import LOCAL_MOUNT_HELP, SHARE_CHANNEL_HELP, MetricChannel, TrainingServiceConfig


class DlcConfig(TrainingServiceConfig):
    """NNI's ``dlc`` section plus a credentials block, an endpoint override and the metric channel.
    Jobs mount the NAS data source at ``containerStorageMountPoint``; this machine sees the same NAS
    at ``localStorageMountPoint``."""

    platform: Literal["dlc"] = "dlc"
    type: str = Field(default="Worker", description="the job spec's role (Worker, Master, Chief, ...)")
    image: str
    job_type: Literal["TFJob", "PyTorchJob"] = "TFJob"
    pod_count: int = Field(default=1, gt=0)
    ecs_spec: str
    region: str = Field(description="region id, e.g. cn-hangzhou ('share' is NNI's shared endpoint)")
    workspace_id: str | None = None
    nas_data_source_id: str
    oss_data_source_id: str | None = None
    access_key_id: SecretStr | None = None
    access_key_secret: SecretStr | None = None
    credentials: str | None = Field(default=None, description="name of a trialflow PAI-DLC credentials block "
                                                              "(the AccessKey pair, instead of writing it here)")
    endpoint: str | None = Field(default=None, description="API endpoint override (default pai-dlc.<region>."
                                                           "aliyuncs.com; http://host:port for plain HTTP)")
    local_storage_mount_point: ConfigPath = Field(description=LOCAL_MOUNT_HELP)
    container_storage_mount_point: str = Field(min_length=1, description="where jobs mount the NAS data source")
    reuse_mode: bool = True
    metric_channel: MetricChannel = Field(default="http", description=SHARE_CHANNEL_HELP)
    spot_discount_limit: float | None = Field(
        default=None, gt=0, le=1, description="run the pods on spot instances at up to this share of the "
        "on-demand price (SpotSpec SpotWithPriceLimit, e.g. 0.5); a reclaimed instance is an interruption")

    @field_validator("pod_count", mode="before")
    @classmethod
    def _pod_count_text(cls, value: Any) -> Any:
        return int(value) if isinstance(value, str) and value.strip().isdigit() else value

    @field_validator("workspace_id")
    @classmethod
    def _none_text(cls, value: str | None) -> str | None:
        return None if value == "None" else value

    @model_validator(mode="after")
    def _rules(self) -> DlcConfig:
        if not self.credentials and (self.access_key_id is None or self.access_key_secret is None):
            raise ValueError("accessKeyId and accessKeySecret are required (or name a PAI-DLC credentials block "
                             "with 'credentials')")
        return self  # the NAS mount is checked at start, where it must be mounted
