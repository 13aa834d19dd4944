"""The ``slurm`` section: a Slurm cluster reached on this login node or over SSH, and each job's
resources."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from .base import TrainingServiceConfig
from .remote import RemoteMachineConfig
from .ssh import HostKeyPolicy, SshLogin

_SLURM_TIME = re.compile(r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+(:\d{1,2}){0,2}|UNLIMITED|INFINITE)$")
_SLURM_OWN_OPTIONS = ("--job-name", "-J", "--output", "-o", "--error", "-e", "--parsable", "--open-mode", "--chdir",
                      "-D", "--wrap")


class SlurmConfig(TrainingServiceConfig, SshLogin, HostKeyPolicy):
    """A Slurm cluster: each trial a batch job (``reuseMode: true``: jobs that host trial after trial).
    Without ``host`` this machine is a login node; with ``host`` the controller reaches one over SSH
    (the remote platform's fields: ``user``, ``sshKeyFile`` or ``password``, or a ``credentials`` block)."""

    platform: Literal["slurm"] = "slurm"
    dump_order = ("host", "port", "user", "password", "ssh_key_file", "ssh_passphrase", "credentials",
                  "trust_unknown_hosts", "known_hosts_file", "python_path", "remote_working_directory",
                  "login_command", "prepare_command", "partition", "account", "qos", "time_limit", "gpus_per_trial",
                  "cpus_per_trial", "memory", "sbatch_options")
    host: str | None = Field(default=None, min_length=1, description="a login node reached over SSH (default: "
                             "this machine is one)")
    python_path: str | None = Field(default=None, description="folder of the python3 the login and compute nodes "
                                    "run the trial runtime with")
    remote_working_directory: str = Field(
        default="~/trialflow-experiments", min_length=1,
        description="a folder on the cluster's shared filesystem (same path on every node) for code, the trial "
        "runtime and trial directories")
    login_command: str | None = Field(default=None, description="shell lines run before each Slurm command on the "
                                      "login node (module load slurm; export SLURM_CONF=...)")
    prepare_command: str | None = Field(default=None, description="shell lines each job runs before the trial "
                                        "(module load, conda activate)")
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_limit: str | None = Field(default=None, description="each job's --time (minutes, HH:MM:SS, D-HH:MM...)")
    gpus_per_trial: int | None = Field(default=None, ge=0, description="GPUs per job (--gres=gpu:N; default "
                                       "trialGpuNumber)")
    cpus_per_trial: int = Field(default=1, gt=0, description="--cpus-per-task of each job")
    memory: str | None = Field(default=None, description="--mem of each job, e.g. 8G")
    sbatch_options: list[str] = Field(default_factory=list, description="more sbatch options, one per item "
                                      "(--constraint=a100)")

    @field_validator("time_limit", mode="before")
    @classmethod
    def _time(cls, value: Any) -> Any:
        value = str(value) if isinstance(value, int) else value
        if isinstance(value, str) and not _SLURM_TIME.match(value.strip()):
            raise ValueError(f"timeLimit {value!r} is not a Slurm time: use minutes, HH:MM:SS or D-HH:MM:SS")
        return value

    @field_validator("memory")
    @classmethod
    def _memory(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"\d+[KMGT]?", value.strip()):
            raise ValueError(f"memory {value!r} is not a Slurm size: use a number with K, M, G or T, e.g. 16G")
        return value.strip() if value else value

    @field_validator("sbatch_options")
    @classmethod
    def _own_options(cls, value: list[str]) -> list[str]:
        for option in value:
            if option.split("=")[0].strip() in _SLURM_OWN_OPTIONS:
                raise ValueError(f"sbatchOptions: {option!r} is set by trialflow for each job; remove it")
        return value

    @model_validator(mode="after")
    def _login(self) -> SlurmConfig:
        if self.host:
            self.login_machine()
        return self

    def login_machine(self) -> RemoteMachineConfig:
        """The login node as a remote machine (``host`` given). Raises ValueError naming what is wrong."""
        login = {name: getattr(self, name) for name in SshLogin.model_fields}
        try:
            return RemoteMachineConfig.model_validate({k: v for k, v in login.items() if v is not None})
        except ValidationError as exc:
            raise ValueError(exc.errors()[0]["msg"].removeprefix("Value error, ")) from None
