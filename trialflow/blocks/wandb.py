"""Prefect block holding a Weights & Biases API key (and the server, for a W&B of one's own).

A ``tracking.wandb`` section in ``mode: online`` names it with ``credentials: <block name>``::

    WandbCredentials(api_key="...").save("wandb")
"""

from __future__ import annotations

from prefect.blocks.core import Block
from pydantic import Field, SecretStr


class WandbCredentials(Block):
    """An API key for Weights & Biases, and the server's address when it is not W&B's cloud."""

    _block_type_name = "trialflow Weights and Biases Credentials"
    _block_type_slug = "trialflow-wandb-credentials"
    _description = "API key (and server) of the Weights & Biases trialflow logs experiments to."

    api_key: SecretStr = Field(description="API key (WANDB_API_KEY)")
    base_url: str | None = Field(default=None, description="a W&B server of one's own (WANDB_BASE_URL); "
                                 "default: W&B's cloud")

    def environment(self) -> dict[str, str]:
        """The variables W&B's client reads its login from."""
        return {"WANDB_API_KEY": self.api_key.get_secret_value(),
                **({"WANDB_BASE_URL": self.base_url} if self.base_url else {})}
