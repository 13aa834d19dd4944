"""Optuna's INFO lines for trialflow's own studies ("A new study created", "Trial N finished"), one
per study and per trial, stay out of trialflow's output, while Optuna's verbosity stays the user's
own for their own studies: :func:`quietly` lowers it only around trialflow's calls."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_LOCK = threading.Lock()


@contextmanager
def quietly() -> Iterator[None]:
    """Optuna at WARNING (or quieter, when the user chose so) inside; the previous verbosity after."""
    import optuna

    with _LOCK:
        before = optuna.logging.get_verbosity()
        optuna.logging.set_verbosity(max(before, logging.WARNING))
        try:
            yield
        finally:
            optuna.logging.set_verbosity(before)
