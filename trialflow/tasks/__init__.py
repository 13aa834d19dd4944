"""The Prefect task library: ``suggest_parameters``, ``upload_code``, ``submit_trial`` and
``poll_trial``, generic over platforms, used by the experiment flow and usable from a user's own
flow (open the experiment with ``trialflow.app.api.experiment_session``). Parameters are ids and small
values; the tasks find the running experiment by its id."""

from __future__ import annotations

from .code import upload_code
from .suggest import suggest_parameters
from .trials import poll_trial, submit_trial

__all__ = ["poll_trial", "submit_trial", "suggest_parameters", "upload_code"]
