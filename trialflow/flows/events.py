"""Prefect events of a running experiment, for automations to match:

* ``trialflow.trial.<outcome>`` (``succeeded``, ``failed``, ``early-stopped``, ``user-canceled``,
  ``sys-canceled``) when a trial's end is recorded; the trial is the event's resource, and its id,
  sequence, status, metric (its final result as a number), final result, parameters, exit code,
  message and seconds run are the payload;
* ``trialflow.experiment.best-trial`` when a trial's metric beats every earlier trial's of the
  experiment (earlier runs included); its payload names the trial, its metric and parameters, and the
  metric it beat (None for the first);
* ``trialflow.experiment.<ending>`` once at the run's end: ``done``, ``failed`` (ERROR, or DONE with
  trials of which none succeeded: the run is Failed then too) or ``stopped``; its payload holds the
  status, message, trial counts by status and the best trial (with several objectives, None: the
  payload's ``pareto`` lists the trials of the Pareto set instead).

Every event names as related resources the experiment (``trialflow.experiment.<id>``, role
``experiment``, named by its ``experimentName``), its platform(s) (``trialflow.platform.<name>``), its
tuner (``trialflow.tuner.<name>``) and the run's tags (``prefect.tag.<tag>``, role ``tag``), so a trigger
can match one experiment, a platform, a tuner or a tag; Prefect adds the flow run, and for a trial's
event the task run following it.

Lifecycle: one :class:`ExperimentEvents` per run of the experiment flow, made before the experiment's
context opens (a run that cannot start still ends with an event); :meth:`ExperimentEvents.trial_ended`
is called from the trials' task threads, :meth:`ExperimentEvents.experiment_ended` once. Emitting queues
the event for Prefect's events worker, which sends it in the background; neither method raises (a
failure is one warning in the experiment's log: an event is never worth an experiment).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from ..config import ExperimentConfig
from ..experiments.results import (
    best_trial,
    maximizes,
    multi_objective,
    nothing_succeeded,
    outcome_counts,
    pareto_set,
    trial_value,
)
from ..foundation.status import ExperimentStatus, TrialStatus
from ..records.store import ExperimentStore, TrialRecord
from .artifacts import json_safe
from .run_control import run_tags

log = logging.getLogger("trialflow.flows.events")
PREFIX = "trialflow"


def _kebab(status: str) -> str:
    return status.lower().replace("_", "-")


def ending(status: str, trials: list[TrialRecord]) -> str:
    """The last word of the experiment's end event: ``done``, ``failed`` or ``stopped``."""
    if status == ExperimentStatus.STOPPED:
        return "stopped"
    failed = status == ExperimentStatus.ERROR or nothing_succeeded(trials) is not None
    return "failed" if failed else "done"


def _trial_summary(trial: TrialRecord) -> dict[str, Any]:
    return {"trial": trial.id, "sequence": trial.sequence, "metric": json_safe(trial_value(trial)),
            "parameters": json_safe(trial.parameters)}


class ExperimentEvents:
    """The events of one run of an experiment (see the module's docstring). Thread-safe."""

    def __init__(self, experiment_id: str, store: ExperimentStore, config: ExperimentConfig) -> None:
        self.experiment_id = experiment_id
        self.store = store
        self._lock = threading.Lock()
        self._maximize = maximizes(store.experiment())
        self._objectives = multi_objective(store.experiment())  # several: no best trial, no new-best event
        best = best_trial(store.trials(), self._maximize)
        self._best = trial_value(best) if best is not None else None
        name = config.experiment_name or experiment_id
        self.experiment = {"prefect.resource.id": f"{PREFIX}.experiment.{experiment_id}",
                           "prefect.resource.name": name, "prefect.resource.role": "experiment"}
        tuner = config.tuner.label if config.tuner else None
        self.related = [self.experiment,
                        *({"prefect.resource.id": f"{PREFIX}.platform.{s.platform}", "prefect.resource.name":
                           s.platform, "prefect.resource.role": "platform"} for s in config.services),
                        *([{"prefect.resource.id": f"{PREFIX}.tuner.{tuner}", "prefect.resource.name": tuner,
                            "prefect.resource.role": "tuner"}] if tuner else []),
                        *({"prefect.resource.id": f"prefect.tag.{tag}", "prefect.resource.role": "tag"}
                          for tag in run_tags(experiment_id, config))]

    def trial_ended(self, trial_id: str) -> None:
        """The trial's end event, and the new-best event when it beat every trial before it. A trial
        whose end is not recorded (left running for a resume) sends nothing."""
        try:
            trial = self.store.trial(trial_id)
            if not trial.is_terminal:
                return
            ran = (trial.end_time - trial.start_time) if trial.end_time and trial.start_time else None
            self._emit(f"{PREFIX}.trial.{_kebab(trial.status)}",
                       {"prefect.resource.id": f"{PREFIX}.trial.{self.experiment_id}.{trial.id}",
                        "prefect.resource.name": trial.id, "trialflow.trial.status": trial.status},
                       {**_trial_summary(trial), "status": trial.status, "final": json_safe(trial.final),
                        "exit_code": trial.exit_code, "message": trial.message, "seconds": ran})
            value = trial_value(trial)
            if trial.status != TrialStatus.SUCCEEDED or value is None or self._objectives is not None:
                return
            with self._lock:
                beaten = self._best
                if beaten is not None and not (value > beaten if self._maximize else value < beaten):
                    return
                self._best = value
            self._emit(f"{PREFIX}.experiment.best-trial", self.experiment,
                       {**_trial_summary(trial), "beaten": json_safe(beaten)})
        except Exception as exc:  # noqa: BLE001 -- an event is never worth a trial's record
            log.warning("trial %s: its event could not be sent: %s", trial_id, exc)

    def experiment_ended(self, status: str, message: str | None, trials: list[TrialRecord] | None = None) -> None:
        """The experiment's end event (``status`` as recorded: DONE, STOPPED, ERROR); ``trials``: its
        trials as the caller has just read them (else read here)."""
        try:
            trials = self.store.trials() if trials is None else trials
            best = best_trial(trials, self._maximize) if self._objectives is None else None
            front = {} if self._objectives is None else \
                {"pareto": [_trial_summary(t) for t in pareto_set(trials, self._objectives)]}
            record = self.store.experiment()
            ran = (record.end_time or time.time()) - record.start_time if record.start_time else None
            self._emit(f"{PREFIX}.experiment.{ending(status, trials)}",
                       {**self.experiment, "trialflow.experiment.status": status},
                       {"status": status, "message": message, "trials": len(trials),
                        "counts": outcome_counts(trials), "best": _trial_summary(best) if best else None,
                        **front, "seconds": ran})
        except Exception as exc:  # noqa: BLE001
            log.warning("experiment %s: its end event could not be sent: %s", self.experiment_id, exc)

    def _emit(self, event: str, resource: dict[str, str], payload: dict[str, Any]) -> None:
        from prefect.events import emit_event

        primary = {k: v for k, v in resource.items() if k != "prefect.resource.role"}
        related = [r for r in self.related if r["prefect.resource.id"] != primary["prefect.resource.id"]]
        emit_event(event, resource=primary, related=related, payload=payload)
