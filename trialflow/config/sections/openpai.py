"""The ``openpai`` section: an OpenPAI cluster's REST server, its storage and the job protocol."""

from __future__ import annotations

from typing import Any, Literal

import yaml
from pydantic import Field, SecretStr, field_validator, model_validator

from .._base import ConfigPath, SizeMB
from .base import DEFAULT_IMAGE, LOCAL_MOUNT_HELP, SHARE_CHANNEL_HELP, MetricChannel, TrainingServiceConfig


class OpenpaiConfig(TrainingServiceConfig):
    platform: Literal["openpai"] = "openpai"
    host: str = Field(description="the cluster's address: its web portal (pylon, /rest-server/ is added) or the "
                                  "REST server itself; https:// is added when no scheme is given")
    username: str | None = Field(default=None, description="OpenPAI user the jobs belong to (or the block's)")
    token: SecretStr | None = Field(default=None, description="the user's application token (or a block's)")
    credentials: str | None = Field(default=None, description="name of a trialflow OpenPAI credentials block "
                                                              "(username and token, instead of writing them here)")
    trial_cpu_number: int = Field(gt=0)
    trial_memory_size: SizeMB
    storage_config_name: str = Field(min_length=1)
    docker_image: str = DEFAULT_IMAGE
    virtual_cluster: str | None = None
    local_storage_mount_point: ConfigPath = Field(description=LOCAL_MOUNT_HELP)
    container_storage_mount_point: str = Field(min_length=1, description="where jobs' containers see that storage "
                                                                         "(OpenPAI mounts it at /mnt/<name>)")
    reuse_mode: bool = True
    openpai_config: dict[str, Any] | None = None
    openpai_config_file: ConfigPath | None = None
    verify_tls: bool = Field(default=True, description="check the server's TLS certificate (false only for a "
                                                       "self-signed test cluster; a warning is logged)")
    ca_bundle: ConfigPath | None = Field(default=None, description="CA bundle (PEM) of a private certificate "
                                                                   "authority to verify the server with")
    metric_channel: MetricChannel = Field(default="http", description=SHARE_CHANNEL_HELP)
    job_priority_class: Literal["crit", "prod", "test", "oppo"] | None = Field(
        default=None, description="the hived scheduler's priority class of the jobs "
        "(extras.hivedScheduler.jobPriorityClass): oppo runs on idle capacity that other jobs preempt, each "
        "preemption an interruption")

    @field_validator("host")
    @classmethod
    def _scheme(cls, value: str) -> str:
        return (value if "://" in value else f"https://{value}").rstrip("/")

    @model_validator(mode="after")
    def _rules(self) -> OpenpaiConfig:
        if self.trial_gpu_number is None:
            raise ValueError("trialGpuNumber must be set for openpai (0 for CPU-only trials)")
        if not self.local_storage_mount_point.is_dir():
            raise ValueError(f'localStorageMountPoint "{self.local_storage_mount_point}" is not a directory')
        if self.openpai_config is not None and self.openpai_config_file is not None:
            raise ValueError("openpaiConfig and openpaiConfigFile can only be set one")
        if self.openpai_config_file is not None and not self.openpai_config_file.is_file():
            raise ValueError(f'openpaiConfigFile "{self.openpai_config_file}" is not a file')
        if self.ca_bundle is not None and not self.ca_bundle.is_file():
            raise ValueError(f'caBundle "{self.ca_bundle}" is not a file')
        if not self.credentials and (not self.username or self.token is None):
            raise ValueError("username and token are required (or name an OpenPAI credentials block with "
                             "'credentials')")
        return self

    def protocol_template(self) -> dict[str, Any] | None:
        """The user's job protocol (openpaiConfig, or openpaiConfigFile read), or None."""
        if self.openpai_config_file is not None:
            loaded = yaml.safe_load(self.openpai_config_file.read_text())
            if not isinstance(loaded, dict):
                raise ValueError(f'openpaiConfigFile "{self.openpai_config_file}" is not a job protocol mapping')
            return loaded
        return self.openpai_config
