"""``nni.recoverable``: the checkpoint hooks NNI's tuners and assessors inherit (no-ops here; a
resumed trialflow experiment replays finished trials to the tuner with ``import_data`` instead)."""

from __future__ import annotations

import os


class Recoverable:
    def load_checkpoint(self) -> None:
        """Nothing to load: trialflow rebuilds a tuner's knowledge with ``import_data`` on resume."""

    def save_checkpoint(self) -> None:
        """Nothing to save: every trial's parameters and results are in the experiment store."""

    def get_checkpoint_path(self) -> str | None:
        """NNI's ``NNI_CHECKPOINT_DIRECTORY`` when set (never set by trialflow)."""
        return os.environ.get("NNI_CHECKPOINT_DIRECTORY")
