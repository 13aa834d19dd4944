"""``nni.recoverable``: the checkpoint hooks NNI's tuners and assessors inherit, as NNI defines them.

trialflow gives a customized algorithm what NNI gives its dispatcher: ``NNI_CHECKPOINT_DIRECTORY``, the
experiment's ``checkpoint/`` folder (the same folder for every run of the experiment), and ``NNI_MODE``
(``start``, or ``resume`` when an earlier run made that folder), and binds each such object to its own
experiment's folder, which :meth:`Recoverable.get_checkpoint_path` answers first. On a resume
``load_checkpoint()`` is called once, before the search space and the earlier trials are handed over;
``save_checkpoint()`` is the class's own to call, as under NNI, whose dispatcher never calls it. A resumed
experiment also replays its finished trials to the tuner with ``import_data``, so a tuner that saves nothing
loses nothing.

``recover_parameter_id``, ``is_created_in_previous_exp`` and ``get_previous_param`` are NNI's, which its
Hyperband and BOHB advisors use on resumed trials' records (``{"parameter_id": ..., "parameters": ...}``, or
such a record as a JSON string).
"""

from __future__ import annotations

import json
import os
from typing import Any


class Recoverable:
    def __init__(self) -> None:
        self.recovered_max_param_id = -1
        self.recovered_trial_params: dict[int, Any] = {}

    def load_checkpoint(self) -> None:
        """Called once when the experiment resumes; a subclass reads what it saved in
        :meth:`get_checkpoint_path`."""

    def save_checkpoint(self) -> None:
        """Never called by trialflow (nor by NNI): a subclass that keeps state calls it itself."""

    def get_checkpoint_path(self) -> str | None:
        """The experiment's checkpoint folder, or None when there is none or it is not a folder: the one
        trialflow bound this object to (so two experiments running in one process each keep their own),
        else ``NNI_CHECKPOINT_DIRECTORY``."""
        path = getattr(self, "_trialflow_checkpoint_directory", None) or os.environ.get("NNI_CHECKPOINT_DIRECTORY")
        return path if path is not None and os.path.isdir(path) else None

    def recover_parameter_id(self, data: Any) -> int:
        """Remember the parameters of resumed trials' records by their integer parameter id (others are
        skipped); returns the largest such id, 0 when there is none."""
        records = data if isinstance(data, list) else [data]
        largest = 0
        for record in records:
            if isinstance(record, str):
                record = json.loads(record)
            parameter_id = record["parameter_id"]
            if not isinstance(parameter_id, int):
                continue  # a customized trial's: not the tuner's to recover
            self.recovered_trial_params[parameter_id] = record["parameters"]
            largest = max(largest, parameter_id)
        self.recovered_max_param_id = largest
        return largest

    def is_created_in_previous_exp(self, param_id: int | None) -> bool:
        """Whether ``param_id`` belongs to a trial of an earlier run (see :meth:`recover_parameter_id`)."""
        return param_id is not None and param_id <= self.recovered_max_param_id

    def get_previous_param(self, param_id: int) -> Any:
        """The parameters an earlier run's trial ``param_id`` had. Raises KeyError for an unknown id."""
        return self.recovered_trial_params[param_id]
