"""The ``prefect`` section: any Prefect work pool as the platform, with the storage its workers share."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from .._base import ConfigPath
from .base import SHARE_CHANNEL_HELP, MetricChannel, TrainingServiceConfig


class PrefectPoolConfig(TrainingServiceConfig):
    """Any Prefect work pool as the platform: each trial (or reuse environment) is a flow run of
    trialflow's trial-runner flow on ``workPool``. The shared storage is a folder this machine sees at
    ``localStorageMountPoint`` and the pool's workers at ``containerStorageMountPoint``."""

    platform: Literal["prefect"] = "prefect"
    work_pool: str = Field(min_length=1, description="the Prefect work pool the trials run on")
    job_variables: dict[str, Any] = Field(default_factory=dict, description="the pool's job variables for every "
                                          "trial's flow run (image, env, cpu/memory where the pool type has them)")
    deployment: str | None = Field(default=None, description="an existing deployment of trialflow's trial-runner "
                                   "flow ('trialflow-trial/<name>'); default: one deployed per experiment")
    local_storage_mount_point: ConfigPath | None = Field(default=None, description="where this machine sees the "
                                                         "shared storage (default: beside the experiment folders)")
    container_storage_mount_point: str | None = Field(default=None, description="where the pool's workers see it "
                                                      "(default: the same path)")
    metric_channel: MetricChannel = Field(default="http", description=SHARE_CHANNEL_HELP)
