"""Prefect block holding an Alibaba Cloud access key for PAI-DLC.

A ``dlc`` training service names it with ``credentials: <block name>`` instead of writing
``accessKeyId`` / ``accessKeySecret`` into the YAML::

    PAIDLCCredentials(access_key_id="...", access_key_secret="...", region="cn-hangzhou").save("dlc")
"""

from __future__ import annotations

from prefect.blocks.core import Block
from pydantic import Field, SecretStr


class PAIDLCCredentials(Block):
    """An Alibaba Cloud AccessKey pair and where the PAI-DLC API is (region or endpoint)."""

    _block_type_name = "trialflow PAI-DLC Credentials"
    _block_type_slug = "trialflow-pai-dlc-credentials"
    _description = "Alibaba Cloud AccessKey and region/endpoint for trialflow's PAI-DLC training service."

    access_key_id: SecretStr = Field(description="AccessKey ID of the RAM user")
    access_key_secret: SecretStr = Field(description="AccessKey secret of the RAM user")
    region: str | None = Field(default=None, description="region id, e.g. cn-hangzhou (the config's when empty)")
    endpoint: str | None = Field(default=None,
                                 description="API endpoint override, e.g. pai-dlc.cn-hangzhou.aliyuncs.com")
