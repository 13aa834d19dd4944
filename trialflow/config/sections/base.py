"""What every platform's ``trainingService`` section shares (NNI's v2 config; reference
docs/nni.md#platform-config-sections): the common fields, the default image, the metric channel's
choices and the words that describe a shared storage's mount points. Config layer: pydantic only."""

from __future__ import annotations

import warnings
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from .._base import ConfigModel, ConfigPath

DEFAULT_IMAGE = "msranni/nni:latest"


class TrainingServiceConfig(ConfigModel):
    """Fields every platform shares; top-level shortcut fields are copied in when missing."""

    platform: str
    trial_command: str = ""
    trial_code_directory: ConfigPath = Field(default=None, validate_default=True)  # type: ignore[assignment]
    trial_gpu_number: int | None = Field(default=None, ge=0)
    nni_manager_ip: str | None = None
    debug: bool = False
    reuse_mode: bool = False
    platform_concurrency: int | None = Field(
        default=None, gt=0, description="at most this many trials of this platform run together across every "
        "experiment using the same Prefect server (a Prefect global concurrency limit)")
    max_concurrency: int | None = Field(
        default=None, gt=0, description="hybrid experiments: at most this many of the experiment's trials run on "
        "this service (default: trialConcurrency, as trialflow update concurrency last set it)")
    weight: float = Field(default=1.0, gt=0, description="hybrid experiments: this service's share of new trials "
                          "scales with weight x free slots")
    platform_concurrency_name: str | None = Field(
        default=None, min_length=1, description="name of that limit (default: trialflow-<platform>); experiments "
        "naming the same limit share its slots")
    max_interruptions: int = Field(
        default=3, ge=0, description="how many times a trial is resubmitted with the same parameters after an "
        "infrastructure event ended its run (preemption, node failure, a requeue); these are not trial failures "
        "and are counted apart (platforms that report them: docs/platforms.md#interruptions)")

    # the experiment's top-level sharedStorage, set on each section when the config loads
    shared_storage: Any = Field(default=None, exclude=True)
    shares_storage: ClassVar[bool] = False  # whether the service uses top-level sharedStorage

    @property
    def cap_name(self) -> str:
        return self.platform_concurrency_name or f"trialflow-{self.platform}"

    # Kubeflow and FrameworkController roles carry their own commands (NNI sets trialCommand to '')
    roles_carry_commands: ClassVar[bool] = False

    @model_validator(mode="after")
    def _command_where_used(self) -> TrainingServiceConfig:
        if self.trial_command.strip():
            return self
        if not self.roles_carry_commands:
            raise ValueError("trialCommand is required: the command that runs one trial, e.g. python3 mnist.py")
        if self.reuse_mode and "reuse_mode" in self.model_fields_set:
            raise ValueError("trialCommand is required with reuseMode: true (each environment runs it for every "
                             "trial; the roles' commands are used only with reuseMode: false)")
        if self.reuse_mode:  # NNI's own role-only configs: run them as NNI does, one job per trial
            warnings.warn("no trialCommand: each trial runs the roles' commands in a job of its own (reuseMode: "
                          "false); set trialCommand to reuse environments between trials", stacklevel=2)
            self.reuse_mode = False
        return self

    @field_validator("trial_code_directory", mode="before")
    @classmethod
    def _default_code_dir(cls, value: Any) -> Any:
        return "." if value is None else value

    @field_validator("trial_code_directory")
    @classmethod
    def _code_dir_exists(cls, value: Any) -> Any:
        if not value.is_dir():
            raise ValueError(f'"{value}" is not a directory; set trialCodeDirectory to the folder of your trial code')
        return value


LOCAL_MOUNT_HELP = ("where this machine sees the shared storage (mounted by you); trialflow copies the code, the "
                "trial runtime and trial files there and reads results back")
MetricChannel = Literal["http", "logs", "file"]
POD_CHANNEL_HELP = ("how trial metrics come back: http (pushed to this controller's receiver; pod logs are the "
                   "fallback), logs (marker lines read from pod logs only) or file (read from the shared storage)")


SHARE_CHANNEL_HELP = ("how trial metrics come back: http (pushed to this controller's receiver; the trial's stdout on "
                  "the shared storage is the fallback), logs (marker lines of the trial's stdout on the shared "
                  "storage only) or file (a metrics file on the shared storage)")
