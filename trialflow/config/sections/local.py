"""The ``local`` section: trials on this machine, with NNI's GPU scheduling fields."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from .._base import GpuIndices
from .base import TrainingServiceConfig


class LocalConfig(TrainingServiceConfig):
    platform: Literal["local"] = "local"
    shares_storage: ClassVar[bool] = True
    use_active_gpu: bool | None = None
    max_trial_number_per_gpu: int = Field(default=1, gt=0)
    gpu_indices: GpuIndices | None = None

    @model_validator(mode="after")
    def _gpu_rules(self) -> LocalConfig:
        self.nni_manager_ip = None
        if self.reuse_mode:
            raise ValueError("reuseMode: true is not available on local (NNI 3.0 fails on it too): local trials "
                             "already start from a warm fork server, with no per-trial environment to keep; "
                             "remove reuseMode")
        if self.trial_gpu_number and self.use_active_gpu is None:
            raise ValueError(
                "useActiveGpu must be set when trialGpuNumber > 0: true if your system has a GUI, "
                "false if the machine runs several experiments concurrently"
            )
        if self.max_trial_number_per_gpu != 1 and self.trial_gpu_number is None:
            raise ValueError("maxTrialNumberPerGpu does not work without trialGpuNumber; set trialGpuNumber")
        return self
