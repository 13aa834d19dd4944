"""An experiment's record as MLflow runs: the experiment one parent run, each ended trial a nested run.

The parent run (tags ``trialflow.experiment_id``, ``trialflow.platform``, ``trialflow.tuner``, the config
as the artifact ``config.json`` with its secrets masked) is found again by its tags when the experiment
runs again (a resume), so nothing is logged twice. A trial's run holds its parameters, every
intermediate result as a step of ``intermediate/<name>``, its final result(s) under their names, its
status (``trialflow.status``; MLflow's FINISHED, FAILED or KILLED), start and end times, and the ends
of its log files (``trial.stdout``, ``trial.stderr``, ``trial.log``) as artifacts under ``logs/``. A
trial's run is terminated last: a run still RUNNING was cut off while being logged, and is deleted
and logged again. At the end the best trial (``trialflow.best``) or the Pareto set
(``trialflow.pareto``) is tagged.

Lifecycle: one :class:`MlflowRuns` per tracking worker; :meth:`connect` first (again after it raised),
then :meth:`log_trial` per ended trial, :meth:`finish` once and :meth:`close`. Every method raises what MLflow's
client raises (the worker retries); it needs ``trialflow[mlflow]``.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..foundation.status import ExperimentStatus, TrialStatus
from ..records.store import ExperimentRecord, Metric, TrialRecord
from .values import as_text, flat_parameters, numbers

KIND = "trialflow.kind"  # "experiment" (the parent run) or "trial"
EXPERIMENT = "trialflow.experiment_id"
TRIAL = "trialflow.trial_id"
STATUS = "trialflow.status"
BEST = "trialflow.best"
PARETO = "trialflow.pareto"
_METRICS_PER_CALL, _PARAMS_PER_CALL = 1000, 100  # the most MLflow takes in one log_batch call
_RUN_STATUS = {TrialStatus.SUCCEEDED: "FINISHED", TrialStatus.FAILED: "FAILED"}  # other ends: KILLED
_EXPERIMENT_STATUS: dict[str, str] = {ExperimentStatus.DONE: "FINISHED", ExperimentStatus.ERROR: "FAILED",
                      ExperimentStatus.STOPPED: "KILLED"}


def _ms(seconds: float | None) -> int | None:
    return int(seconds * 1000) if seconds is not None else None


class _Answering:
    """The MLflow client, calling ``answered()`` after each of its calls that returned."""

    def __init__(self, client: Any, answered: Callable[[], None]) -> None:
        self._client, self._answered = client, answered

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            result = attribute(*args, **kwargs)
            self._answered()
            return result

        return call


class MlflowRuns:
    def __init__(self, experiment_id: str, tracking_uri: str, mlflow_experiment: str,
                 answered: Callable[[], None] | None = None) -> None:
        from mlflow import MlflowClient

        self.client: Any = _Answering(MlflowClient(tracking_uri=tracking_uri), answered or (lambda: None))
        self.where = f"MLflow at {tracking_uri}"
        self.mlflow_experiment = mlflow_experiment
        self.experiment_id = experiment_id
        self.parent: str | None = None  # the parent run's id, once connected
        self.runs: dict[str, str] = {}  # trial id -> its run's id

    # ---- the experiment ---------------------------------------------------------------------

    def connect(self, record: ExperimentRecord, config: dict[str, Any], platforms: str,
                tuner: str | None) -> set[str]:
        """Find or make the MLflow experiment and the parent run (RUNNING again); returns the ids of
        the trials already logged, deleting the runs of trials whose logging was cut off."""
        from mlflow.exceptions import MlflowException

        found = self.client.get_experiment_by_name(self.mlflow_experiment)
        if found is None:
            try:
                mlflow_id = self.client.create_experiment(self.mlflow_experiment)
            except MlflowException:  # made meanwhile by another experiment's worker
                made = self.client.get_experiment_by_name(self.mlflow_experiment)
                if made is None:
                    raise
                mlflow_id = made.experiment_id
        else:
            mlflow_id = found.experiment_id
        self._mlflow_id = mlflow_id
        mine = f"tags.`{EXPERIMENT}` = '{self.experiment_id}'"
        parents = self._search(f"{mine} and tags.`{KIND}` = 'experiment'")
        if parents:
            self.parent = parents[0].info.run_id
            self.client.update_run(self.parent, status="RUNNING")
        else:
            tags = {KIND: "experiment", EXPERIMENT: self.experiment_id, "trialflow.platform": platforms,
                    **({"trialflow.tuner": tuner} if tuner else {})}
            run = self.client.create_run(mlflow_id, start_time=_ms(record.start_time), tags=tags,
                                         run_name=record.name or self.experiment_id)
            self.parent = run.info.run_id
            with tempfile.TemporaryDirectory() as folder:
                path = Path(folder) / "config.json"
                path.write_text(json.dumps(config, indent=2, default=str))
                self.client.log_artifact(self.parent, str(path))
        self.runs = {}
        for run in self._search(f"{mine} and tags.`{KIND}` = 'trial'"):
            if run.info.status == "RUNNING":
                self.client.delete_run(run.info.run_id)  # cut off while being logged
            else:
                self.runs[run.data.tags[TRIAL]] = run.info.run_id
        return set(self.runs)

    def _search(self, query: str) -> list[Any]:
        runs: list[Any] = []
        token = None
        while True:
            page = self.client.search_runs([self._mlflow_id], filter_string=query, max_results=1000,
                                           page_token=token)
            runs.extend(page)
            token = page.token
            if not token:
                return runs

    def finish(self, record: ExperimentRecord) -> None:
        """Tag the best trial's run (or the Pareto set's) and end the parent run as the experiment
        ended; a record still RUNNING (a full disk) leaves it running."""
        assert self.parent is not None
        chosen = set(record.pareto) if record.pareto is not None else {record.best_trial} - {None}
        tag = PARETO if record.pareto is not None else BEST
        for run in self._search(f"tags.`{EXPERIMENT}` = '{self.experiment_id}' and tags.`{tag}` = 'true'"):
            if run.data.tags.get(TRIAL) not in chosen:  # an earlier run's best, beaten since
                self.client.delete_tag(run.info.run_id, tag)
        for trial_id in sorted(t for t in chosen if t in self.runs):
            self.client.set_tag(self.runs[trial_id], tag, "true")
        if record.best_trial:
            self.client.set_tag(self.parent, "trialflow.best_trial", record.best_trial)
        self.client.set_tag(self.parent, STATUS, record.status)
        if record.status in _EXPERIMENT_STATUS:
            self.client.set_terminated(self.parent, _EXPERIMENT_STATUS[record.status], end_time=_ms(record.end_time))

    def close(self) -> None:
        """Nothing to stop: the client holds no process."""

    # ---- a trial ----------------------------------------------------------------------------

    def log_trial(self, trial: TrialRecord, metrics: list[Metric], logs: dict[str, str]) -> None:
        """Log one ended trial as a nested run with its ``logs`` (file name -> text), terminated last
        (so a cut-off one is found RUNNING)."""
        from mlflow.entities import Metric as MlflowMetric
        from mlflow.entities import Param, RunTag

        assert self.parent is not None
        if trial.id in self.runs:
            return
        started = trial.start_time or trial.submit_time
        tags = {KIND: "trial", EXPERIMENT: self.experiment_id, TRIAL: trial.id, "mlflow.parentRunId": self.parent,
                STATUS: trial.status, "trialflow.sequence": str(trial.sequence)}
        run = self.client.create_run(self._mlflow_id, start_time=_ms(started), tags=tags, run_name=trial.id)
        run_id = run.info.run_id
        extra = {k: v for k, v in (("trialflow.exit_code", trial.exit_code), ("trialflow.message", trial.message))
                 if v is not None}
        values = []
        for metric in metrics:
            if metric.type == "PERIODICAL":
                values += [MlflowMetric(f"intermediate/{k}", v, _ms(metric.time) or 0, metric.sequence)
                           for k, v in numbers(metric.value).items()]
        final_at = int((trial.end_time or time.time()) * 1000)
        values += [MlflowMetric(k, v, final_at, 0) for k, v in numbers(trial.final).items()]
        params = [Param(k, as_text(v)[:6000]) for k, v in flat_parameters(trial.parameters).items()]
        tag_list = [RunTag(k, str(v)[:5000]) for k, v in extra.items()]
        calls = max(1, -(-len(values) // _METRICS_PER_CALL), -(-len(params) // _PARAMS_PER_CALL))
        for i in range(calls):
            self.client.log_batch(run_id, metrics=values[i * _METRICS_PER_CALL:(i + 1) * _METRICS_PER_CALL],
                                  params=params[i * _PARAMS_PER_CALL:(i + 1) * _PARAMS_PER_CALL],
                                  tags=tag_list if i == 0 else [])
        self._log_output(run_id, logs)
        self.client.set_terminated(run_id, _RUN_STATUS.get(TrialStatus(trial.status), "KILLED"),
                                   end_time=_ms(trial.end_time))
        self.runs[trial.id] = run_id

    def _log_output(self, run_id: str, logs: dict[str, str]) -> None:
        """The trial's log files (``trial.stdout``, ``trial.stderr``, ``trial.log``) under ``logs/``, those
        that hold something."""
        logs = {name: text for name, text in logs.items() if text}  # an upload each: empty files are left out
        if not logs:
            return
        with tempfile.TemporaryDirectory() as tmp:
            for name, text in logs.items():
                (Path(tmp) / Path(name).name).write_text(text, encoding="utf-8")
            self.client.log_artifacts(run_id, tmp, "logs")
