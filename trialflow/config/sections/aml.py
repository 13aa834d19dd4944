"""The ``aml`` section: an Azure ML workspace, its compute target and the datastore jobs mount."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .._base import ConfigPath
from .base import DEFAULT_IMAGE, LOCAL_MOUNT_HELP, SHARE_CHANNEL_HELP, MetricChannel, TrainingServiceConfig


class AmlConfig(TrainingServiceConfig):
    """NNI's ``aml`` section plus a credentials block and the datastore jobs mount: code, the trial
    runtime and trial files live on that datastore (``localStorageMountPoint`` is where this machine
    sees its file share or blob container), so no code upload to Azure Storage is needed."""

    platform: Literal["aml"] = "aml"
    subscription_id: str
    resource_group: str
    workspace_name: str
    compute_target: str
    docker_image: str = DEFAULT_IMAGE
    max_trial_number_per_gpu: int = Field(default=1, gt=0)
    credentials: str | None = Field(default=None, description="name of a trialflow Azure ML credentials block "
                                                              "(default: azure-identity's DefaultAzureCredential)")
    datastore: str = Field(default="workspaceworkingdirectory", min_length=1,
                           description="the workspace datastore jobs mount read-write (an Azure file share or blob "
                                       "container this machine also mounts)")
    datastore_path: str = Field(default="", description="folder inside the datastore")
    local_storage_mount_point: ConfigPath | None = Field(default=None,
                                                         description=LOCAL_MOUNT_HELP + "; required to run")
    reuse_mode: bool = True
    metric_channel: MetricChannel = Field(default="http", description=SHARE_CHANNEL_HELP)
    job_tier: Literal["Spot", "Basic", "Standard", "Premium"] | None = Field(
        default=None, description="the jobs' tier (queue settings): Spot runs on capacity Azure may preempt, each "
        "preemption an interruption (so is one on a low-priority compute cluster)")
