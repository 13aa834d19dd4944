"""Prefect block holding Azure ML credentials: a service principal, a managed identity, or the
default credential chain.

An ``aml`` training service names it with ``credentials: <block name>``; without secrets set, the
azure-identity ``DefaultAzureCredential`` chain (environment, managed identity, ``az login``) is used::

    AzureMLCredentials(tenant_id="...", client_id="...", client_secret="...").save("aml")
"""

from __future__ import annotations

from prefect.blocks.core import Block
from pydantic import Field, SecretStr


class AzureMLCredentials(Block):
    """A service principal (tenant, client id, secret) or, left empty, Azure's default credential chain."""

    _block_type_name = "trialflow Azure ML Credentials"
    _block_type_slug = "trialflow-azure-ml-credentials"
    _description = "Service principal or default credential settings for trialflow's Azure ML training service."

    tenant_id: str | None = Field(default=None, description="Microsoft Entra tenant of the service principal")
    client_id: str | None = Field(default=None, description="application (client) id of the service principal")
    client_secret: SecretStr | None = Field(default=None, description="client secret of the service principal")
    managed_identity: bool = Field(default=False, description="use the machine's managed identity (client_id names "
                                                              "a user-assigned one)")
    use_default_credential: bool = Field(default=True, description="fall back to DefaultAzureCredential (environment, "
                                                                   "managed identity, az login) when no secret is set")
