"""Experiment trackers: the record logged where teams compare models (MLflow, W&B), by the controller.

The controller starts a tracking worker per tracker beside it (:mod:`.launch`), which logs from the
experiment's record (:mod:`.worker`, with :mod:`.mlflow_runs` or :mod:`.wandb_runs`), so trial code
stays unchanged and every platform is covered; :mod:`.values` turns parameters and results into a
tracker's flat names.
"""

from .launch import Tracking, tracking

__all__ = ["Tracking", "tracking"]
