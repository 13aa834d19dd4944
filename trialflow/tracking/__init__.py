"""Experiment trackers: the record logged where teams compare models (MLflow), by the controller.

The controller starts a tracking worker beside it (:mod:`.launch`), which logs from the experiment's
record (:mod:`.worker`, :mod:`.mlflow_runs`), so trial code stays unchanged and every platform is
covered; :mod:`.values` turns parameters and results into a tracker's flat names.
"""

from .launch import Tracking, tracking

__all__ = ["Tracking", "tracking"]
