"""Prefect blocks holding platform credentials, one module per platform.

Blocks sit below ``trialflow.platforms``: they hold fields (secrets as ``SecretStr``, masked in the
Prefect UI, never in flow parameters, logs or error messages) and import nothing from the platform
layer; each platform loads its block through :func:`load_block` and turns it into a client.
``prefect block register -m trialflow.blocks`` puts every block type in the UI's catalog.
"""

from __future__ import annotations

from ._load import BlockNotFoundError, load_block
from .aml import AzureMLCredentials
from .dlc import PAIDLCCredentials
from .dlts import DLTSCredentials
from .kubernetes import KubernetesCredentials
from .mlflow import MLflowCredentials
from .openpai import OpenPAICredentials
from .remote import SSHCredentials
from .wandb import WandbCredentials

__all__ = ["AzureMLCredentials", "BlockNotFoundError", "DLTSCredentials", "KubernetesCredentials",
           "MLflowCredentials", "OpenPAICredentials", "PAIDLCCredentials", "SSHCredentials", "WandbCredentials",
           "load_block"]
