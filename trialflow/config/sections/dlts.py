"""The ``dlts`` section: a DLTS cluster's dashboard, team and the work directory jobs share."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from .._base import ConfigPath
from .base import DEFAULT_IMAGE, LOCAL_MOUNT_HELP, SHARE_CHANNEL_HELP, MetricChannel, TrainingServiceConfig


class DltsConfig(TrainingServiceConfig):
    """NNI's v1 ``dltsConfig`` (dashboard, cluster, team, email, password, gpuType, image) plus where
    the cluster's shared work directory is seen here and in jobs (NNI's manager ran inside a DLTS job,
    where both are the same path)."""

    platform: Literal["dlts"] = "dlts"
    dashboard: str = Field(description="the cluster's dashboard URL (the API is under <dashboard>api/)")
    cluster: str = ".default"
    team: str | None = Field(default=None, description="team (virtual cluster); default $DLWS_VC_NAME")
    email: str | None = Field(default=None, description="your dashboard e-mail; default $DLWS_USER_EMAIL")
    password: SecretStr | None = Field(default=None, description="your dashboard password or token; default "
                                                                 "$DLTS_JOB_TOKEN")
    credentials: str | None = Field(default=None, description="name of a trialflow DLTS credentials block")
    gpu_type: str | None = Field(default=None, description="GPU type of the jobs; fetched from the team's cluster "
                                                           "when not set")
    image: str = DEFAULT_IMAGE
    local_storage_mount_point: ConfigPath = Field(default="~", validate_default=True,  # type: ignore[assignment]
                                                  description=LOCAL_MOUNT_HELP)
    container_storage_mount_point: str | None = Field(default=None, description="where jobs see that work directory "
                                                      "(default: the same path as here)")
    verify_tls: bool = True
    ca_bundle: ConfigPath | None = None
    metric_channel: MetricChannel = Field(default="http", description=SHARE_CHANNEL_HELP)
    preemptible: bool = Field(default=False, description="let the cluster pause the jobs for other work "
                              "(preemptionAllowed): cheap capacity; each pause is an interruption")

    @field_validator("dashboard")
    @classmethod
    def _slash(cls, value: str) -> str:
        value = value if "://" in value else f"https://{value}"
        return value if value.endswith("/") else value + "/"

    @model_validator(mode="after")
    def _defaults(self) -> DltsConfig:
        self.team = self.team or os.environ.get("DLWS_VC_NAME") or None
        self.email = self.email or os.environ.get("DLWS_USER_EMAIL") or None
        if self.password is None and os.environ.get("DLTS_JOB_TOKEN"):
            self.password = SecretStr(os.environ["DLTS_JOB_TOKEN"])
        if not self.credentials and (not self.email or self.password is None):
            raise ValueError("email and password are required (or $DLWS_USER_EMAIL and $DLTS_JOB_TOKEN, or a DLTS "
                             "credentials block named with 'credentials')")
        if not self.local_storage_mount_point.is_dir():
            raise ValueError(f'localStorageMountPoint "{self.local_storage_mount_point}" is not a directory')
        if self.container_storage_mount_point is None:
            self.container_storage_mount_point = str(self.local_storage_mount_point)
        return self
