"""Prefect block holding an OpenPAI login: the REST server and a user's application token.

An ``openpai`` training service names it with ``credentials: <block name>`` instead of writing
``token:`` into the YAML::

    OpenPAICredentials(host="https://pai.example.org", username="alice", token="...").save("pai")
"""

from __future__ import annotations

from prefect.blocks.core import Block
from pydantic import Field, SecretStr


class OpenPAICredentials(Block):
    """An OpenPAI cluster's address, a user and that user's token (Bearer authentication)."""

    _block_type_name = "trialflow OpenPAI Credentials"
    _block_type_slug = "trialflow-openpai-credentials"
    _description = "OpenPAI REST server, user name and application token for trialflow's openpai training service."

    host: str | None = Field(default=None, description="the cluster's address (pylon front end or REST server); "
                                                        "the config's host is used when empty")
    username: str = Field(description="OpenPAI user that owns the jobs")
    token: SecretStr = Field(description="application token from the OpenPAI web portal (Profile > Tokens)")
    verify_tls: bool = Field(default=True, description="check the server's TLS certificate")
    ca_bundle: str | None = Field(default=None, description="path of a CA bundle for a private certificate authority")
