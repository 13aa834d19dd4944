"""A platform's row of the platform table: its config model (the row's name comes from it), its
service class, its credentials block, the pip extra it needs and its retry policy. Each built-in
service module defines its own (``PLATFORM``), as a plugin package does; :mod:`.table` gathers them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import RetryPolicy

if TYPE_CHECKING:
    from prefect.blocks.core import Block

    from ..config.sections.base import TrainingServiceConfig
    from .base import TrainingService


@dataclass(frozen=True)
class Platform:
    config: type[TrainingServiceConfig]
    service: type[TrainingService] | None  # None: its config validates, but this version cannot run it (create says so)
    block: type[Block] | None = None
    extra: str | None = None  # ``pip install 'trialflow[<extra>]'``
    retry: RetryPolicy = RetryPolicy()

    @property
    def name(self) -> str:
        return str(self.config.model_fields["platform"].default)
