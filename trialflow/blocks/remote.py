"""Prefect block holding SSH credentials for remote machines.

A ``machineList`` entry names a saved block with ``credentials: <block name>`` instead of writing
a password or key into the YAML. Create one in Python::

    SSHCredentials(username="alice", private_key_file="~/.ssh/id_ed25519").save("gpu-box")

or in the UI (block type "trialflow SSH Credentials").
"""

from __future__ import annotations

from prefect.blocks.core import Block
from pydantic import Field, SecretStr


class SSHCredentials(Block):
    """Login for a remote machine: a password, a private key (file or text), optional passphrase."""

    _block_type_name = "trialflow SSH Credentials"
    _block_type_slug = "trialflow-ssh-credentials"
    _description = "SSH login (user and password or private key) for trialflow's remote training service."

    username: str = Field(description="user to log in as")
    password: SecretStr | None = Field(default=None, description="password (leave empty to use a key)")
    private_key: SecretStr | None = Field(default=None, description="private key text (OpenSSH or PEM)")
    private_key_file: str | None = Field(default=None, description="path of a private key file on the controller")
    passphrase: SecretStr | None = Field(default=None, description="passphrase of an encrypted private key")
