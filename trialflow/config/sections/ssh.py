"""What the sections reaching machines over SSH share (``remote``'s machines, ``slurm``'s login node):
the login -- address, user and credentials, the Python and folder used there -- and the host-key
policy. Config layer: pydantic only; the connection itself is :mod:`trialflow.platforms.ssh`'s."""

from __future__ import annotations

from pydantic import Field, SecretStr

from .._base import ConfigPath, OrderedDump


class SshLogin(OrderedDump):
    """An SSH login: ``host`` and ``port``, ``user`` with a ``password`` or an ``sshKeyFile`` (and its
    passphrase), or a credentials block; the ``pythonPath`` and ``remoteWorkingDirectory`` used there."""

    host: str | None = Field(default=None, min_length=1)
    port: int = Field(default=22, gt=0, lt=65536)
    user: str | None = None
    password: SecretStr | None = None
    ssh_key_file: ConfigPath | None = None
    ssh_passphrase: SecretStr | None = None
    credentials: str | None = Field(default=None, description="name of a trialflow SSH credentials block")
    python_path: str | None = None
    remote_working_directory: str = Field(
        default="~/trialflow-experiments", min_length=1,
        description="where code bundles, the trial runtime and trial directories live on the machine")


class HostKeyPolicy(OrderedDump):
    """Which SSH host keys are trusted: those in ``knownHostsFile``, and new ones on first use when
    ``trustUnknownHosts`` says so."""

    trust_unknown_hosts: bool = Field(default=False, description="trust SSH host keys on first use")
    known_hosts_file: ConfigPath = Field(default="~/.ssh/known_hosts", validate_default=True,  # type: ignore[assignment]
                                         description="OpenSSH known_hosts file checked (and, on first use, extended)")
