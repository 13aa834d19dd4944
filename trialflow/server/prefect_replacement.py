"""Replacing one function of Prefect's server modules in this process.

The kept server's process changes a few of Prefect's server functions before its app starts
(:mod:`trialflow.server.kept_server_app`, :mod:`trialflow.server.sqlite_batch_writes`). Each change is
made only where this Prefect has what it replaces, so a Prefect whose internals moved runs as Prefect
has it instead of failing to start.

Lifecycle: called in the kept server's process only, before its app is created; a replacement lasts
as long as the process.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any


def replace_in_prefect(module: str, name: str, make: Callable[[Any, ModuleType], Any]) -> bool:
    """Set ``module.name`` to ``make(original, imported_module)`` in this process; True when replaced.
    False, and nothing changed, where this Prefect lacks that module or name, or ``make`` finds the
    module lacking what it reads (it raised ImportError or AttributeError)."""
    try:
        imported = importlib.import_module(module)
        replacement = make(getattr(imported, name), imported)
    except (ImportError, AttributeError):
        return False
    setattr(imported, name, replacement)
    return True
