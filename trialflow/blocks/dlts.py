"""Prefect block holding a DLTS (Deep Learning Training Service) login: e-mail and password.

A ``dlts`` training service names it with ``credentials: <block name>``::

    DLTSCredentials(email="alice@example.org", password="...").save("dlts")
"""

from __future__ import annotations

from prefect.blocks.core import Block
from pydantic import Field, SecretStr


class DLTSCredentials(Block):
    """The DLTS dashboard login that jobs are submitted as."""

    _block_type_name = "trialflow DLTS Credentials"
    _block_type_slug = "trialflow-dlts-credentials"
    _description = "DLTS dashboard e-mail and password for trialflow's dlts training service."

    email: str = Field(description="the user's e-mail address on the DLTS dashboard")
    password: SecretStr = Field(description="the user's DLTS password")
    team: str | None = Field(default=None, description="team (virtual cluster) to submit to; the config's when empty")
