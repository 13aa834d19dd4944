"""Prefect block holding SSH credentials for remote machines.

A ``machineList`` entry names a saved block with ``credentials: <block name>`` instead of writing
a password or key into the YAML. Secrets are ``SecretStr``: shown masked in the Prefect UI, never
put in flow parameters, logs or error messages. Create one in Python::

    SSHCredentials(username="alice", private_key_file="~/.ssh/id_ed25519").save("gpu-box")

or in the UI (block type "trialflow SSH Credentials").
"""

from __future__ import annotations

from pathlib import Path

from prefect.blocks.core import Block
from pydantic import Field, SecretStr

from ..tasks.training_services.base import PlatformError
from ..tasks.training_services.ssh import SshTarget


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

    def target(self, host: str, port: int, user: str | None = None) -> SshTarget:
        if self.password is None and self.private_key is None and not self.private_key_file:
            raise PlatformError(f"SSH credentials for {host}: set a password, private_key or private_key_file")
        key_file = Path(self.private_key_file).expanduser() if self.private_key_file else None
        return SshTarget(host, port, user or self.username, self.password, key_file, self.private_key,
                         self.passphrase)

    @classmethod
    def load_target(cls, name: str, host: str, port: int, user: str | None = None) -> SshTarget:
        """Load the saved block ``name`` and turn it into a login for ``host:port``."""
        try:
            block = cls.load(name)
        except ValueError as exc:
            raise PlatformError(f"SSH credentials block {name!r} not found ({exc}); create it with "
                                f"SSHCredentials(...).save({name!r}) or in the Prefect UI") from None
        return block.target(host, port, user)  # type: ignore[union-attr]
