"""Loading a saved credentials block by name, with an error that says how to create it."""

from __future__ import annotations

from typing import Any, TypeVar

from prefect.blocks.core import Block

from ..foundation.user_errors import UserError

B = TypeVar("B", bound=Block)


class BlockNotFoundError(UserError, LookupError):
    """No saved block of that name (and type); the message says how to save one."""


def load_block(block_type: type[B], name: str) -> B | Any:
    """The saved block ``name`` of ``block_type``; ``<type slug>/<name>`` loads a block of any type
    (for example ``kubernetes-credentials/prod`` from prefect-kubernetes)."""
    try:
        return Block.load(name) if "/" in name else block_type.load(name)
    except (ValueError, KeyError) as exc:
        from prefect.settings import PREFECT_API_URL

        cls = block_type.__name__
        where = PREFECT_API_URL.value() or "Prefect's temporary server"
        raise BlockNotFoundError(
            f"{cls} block {name!r} not found in the Prefect API at {where} ({exc}); create it there with "
            f"{cls}(...).save({name!r}) inside `with trialflow.prefect_api():` (or in a shell after "
            f'eval "$(trialflow server env)"), or in that server\'s UI') from None
