"""The ``remote`` section: NNI's machine list, each machine an SSH login with its GPUs."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from .._base import GpuIndices, resolve_path
from .base import TrainingServiceConfig
from .ssh import HostKeyPolicy, SshLogin


class RemoteMachineConfig(SshLogin):
    # one machine of machineList: its SSH login and how its GPUs are shared (no docstring: it would
    # become the config schema's description)

    dump_order = ("host", "port", "user", "password", "ssh_key_file", "ssh_passphrase", "credentials",
                  "use_active_gpu", "max_trial_number_per_gpu", "gpu_indices", "python_path",
                  "remote_working_directory")
    host: str = Field(min_length=1)
    use_active_gpu: bool = False
    max_trial_number_per_gpu: int = Field(default=1, gt=0)
    gpu_indices: GpuIndices | None = None

    @model_validator(mode="after")
    def _auth(self) -> RemoteMachineConfig:
        if self.credentials:
            return self
        if not self.user:
            raise ValueError("user is required (or name a credentials block with 'credentials')")
        if self.password is not None:
            self.ssh_key_file = None
            return self
        key = self.ssh_key_file or resolve_path("~/.ssh/id_rsa", None)
        if not key.is_file():
            raise ValueError(f'provide a password or a valid SSH key file: sshKeyFile "{key}" is not a file')
        self.ssh_key_file = key
        return self


class RemoteConfig(TrainingServiceConfig, HostKeyPolicy):
    platform: Literal["remote"] = "remote"
    dump_order = ("machine_list", "trust_unknown_hosts", "known_hosts_file")
    shares_storage: ClassVar[bool] = True
    machine_list: list[RemoteMachineConfig] = Field(min_length=1)

    @model_validator(mode="after")
    def _per_gpu(self) -> RemoteConfig:
        if self.trial_gpu_number is None and any(m.max_trial_number_per_gpu != 1 for m in self.machine_list):
            raise ValueError("maxTrialNumberPerGpu does not work without trialGpuNumber; set trialGpuNumber")
        return self
