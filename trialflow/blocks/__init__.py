"""Prefect blocks holding platform credentials, one module per platform.

Blocks sit below ``trialflow.platforms``: they hold fields (secrets as ``SecretStr``, masked in the
Prefect UI, never in flow parameters, logs or error messages) and import nothing from the platform
layer; each platform loads its block through :func:`load_block` and turns it into a client.
``prefect block register -m trialflow.blocks`` puts every block type in the UI's catalog: every block
class defined in a module of this package is a name of the package, gathered when it is imported (a
new platform's block needs its module only).
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING

from ._load import BlockNotFoundError, load_block

if TYPE_CHECKING:  # the names below are gathered at import; these lines give them their types
    from prefect.blocks.core import Block

    from .aml import AzureMLCredentials
    from .dlc import PAIDLCCredentials
    from .dlts import DLTSCredentials
    from .kubernetes import KubernetesCredentials
    from .mlflow import MLflowCredentials
    from .openpai import OpenPAICredentials
    from .remote import SSHCredentials
    from .wandb import WandbCredentials


def _blocks_of_the_package() -> dict[str, type[Block]]:
    """Every block class the package's modules define, by name."""
    from prefect.blocks.core import Block  # here, so that the base class is no name of the package

    found: dict[str, type[Block]] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        found |= {name: obj for name, obj in vars(module).items()
                  if isinstance(obj, type) and issubclass(obj, Block) and obj.__module__ == module.__name__}
    return found


globals().update(_blocks_of_the_package())

__all__ = ["AzureMLCredentials", "BlockNotFoundError", "DLTSCredentials", "KubernetesCredentials",
           "MLflowCredentials", "OpenPAICredentials", "PAIDLCCredentials", "SSHCredentials", "WandbCredentials",
           "load_block"]
