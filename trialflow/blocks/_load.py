"""Loading a saved credentials block by name, with an error that says how to create it."""

from __future__ import annotations

from typing import Any, TypeVar

from prefect.blocks.core import Block

from ..user_errors import UserError

B = TypeVar("B", bound=Block)


class BlockNotFoundError(UserError, LookupError):
    """No saved block of that name (and type); the message says how to save one."""


def load_block(block_type: type[B], name: str) -> B | Any:
    """The saved block ``name`` of ``block_type``; ``<type slug>/<name>`` loads a block of any type
    (for example ``kubernetes-credentials/prod`` from prefect-kubernetes)."""
    try:
        return Block.load(name) if "/" in name else block_type.load(name)
    except (ValueError, KeyError) as exc:
        cls = block_type.__name__
        raise BlockNotFoundError(f"{cls} block {name!r} not found ({exc}); create it with "
                                 f"{cls}(...).save({name!r}) or in the Prefect UI") from None
