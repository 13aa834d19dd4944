"""Modules imported on first use (the CLI's start-up: ``trialflow --help`` imports none of them)."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from .startup_gc import collector_paused


class LazyModule(ModuleType):
    """Stands for module ``name`` and imports it at the first attribute read. Raises what the import
    raises, then."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._module: ModuleType | None = None

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__") or attribute == "_module":
            raise AttributeError(attribute)
        if self._module is None:
            with collector_paused():
                self._module = importlib.import_module(self.__name__)
        return getattr(self._module, attribute)


def lazy_module(name: str) -> Any:
    return LazyModule(name)
