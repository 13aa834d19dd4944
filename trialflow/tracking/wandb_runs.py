"""An experiment's record as Weights & Biases runs, grouped by the experiment.

Each ended trial is a run (id ``<experiment id>-<trial id>``, job type ``trial``, group the experiment
id) with its parameters as the run's config (named as in MLflow), every intermediate result as a step of
``intermediate/<name>``, its final result(s) under their names in the summary, its status (tag and
``trialflow.status``; W&B's finished for a success, failed otherwise), start and end times, exit code
and message, and the ends of its log files as the run's files under ``logs/``. At the experiment's
end one more run (id the experiment's, job type ``experiment``) holds the config with its secrets
masked, the platforms, the tuner, the status, and the best trial (``trialflow.best_trial``) or the
Pareto set (``trialflow.pareto``): a finished W&B run cannot be tagged again, so the choice is named
there.

The runs' files are written under ``folder/wandb`` (the experiment's folder): in offline mode they
are all there is, sent later with ``wandb sync``. A trial counts as logged once its run finished and
its id was appended to ``folder/logged-trials``; a run folder of this experiment's trial that is not
listed there was cut off while being logged and is deleted when the next run connects, then logged
again whole. The experiment's own run is written again at each end (its earlier folder deleted), so
a resume names the final choice once.

Lifecycle: one :class:`WandbRuns` per tracking worker; :meth:`connect` first (again after it raised),
then :meth:`log_trial` per ended trial, :meth:`finish` once, :meth:`close` at the worker's exit. Every
method raises what W&B's client raises (the worker retries); it needs ``trialflow[wandb]``.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any, Literal

from ..foundation.status import TrialStatus
from ..records.store import ExperimentRecord, Metric, TrialRecord
from .values import flat_parameters, numbers

LEDGER = "logged-trials"  # trial ids whose runs finished, one per line
RUN_FOLDER_PREFIXES = ("offline-run-", "run-")  # W&B's names: <prefix><time>-<run id>


class WandbRuns:
    def __init__(self, experiment_id: str, folder: str, project: str, mode: Literal["offline", "online"],
                 entity: str | None) -> None:
        import wandb

        self.wandb = wandb
        self.experiment_id = experiment_id
        self.folder = Path(folder)
        self.project, self.mode, self.entity = project, mode, entity
        self.where = f"W&B project {project} ({mode})"
        self.runs: dict[str, str] = {}  # trial id -> its run's id
        # what the experiment's run holds beside the record, from connect
        self._config: dict[str, Any] = {}
        self._platforms = ""
        self._tuner: str | None = None

    def _settings(self) -> Any:
        """What W&B records of this machine beside the run: nothing (no system metrics, code, git, packages or
        console capture; the trial's own output is logged as files)."""
        return self.wandb.Settings(console="off", silent=True, x_disable_stats=True, x_disable_meta=True,
                                   x_save_requirements=False, disable_git=True, save_code=False, init_timeout=30)

    def _start(self, run_id: str, name: str, job_type: str, config: dict[str, Any], tags: list[str]) -> Any:
        return self.wandb.init(mode=self.mode, dir=str(self.folder), project=self.project, entity=self.entity,
                               group=self.experiment_id, job_type=job_type, name=name, id=run_id, config=config,
                               tags=tags, resume="allow" if self.mode == "online" else None, reinit="create_new",
                               settings=self._settings())

    def _run_folders(self) -> dict[Path, str]:
        """The run folders under ``folder/wandb`` (one per time a run was started) -> their runs' ids."""
        root = self.folder / "wandb"
        found: dict[Path, str] = {}
        for path in (root.iterdir() if root.is_dir() else ()):
            prefix = next((p for p in RUN_FOLDER_PREFIXES if path.name.startswith(p)), None)
            if prefix and path.is_dir() and not path.is_symlink():
                found[path] = path.name[len(prefix):].partition("-")[2]
        return found

    def connect(self, record: ExperimentRecord, config: dict[str, Any], platforms: str,
                tuner: str | None) -> set[str]:
        """Read which trials are logged; delete the folders of trials whose logging was cut off. Returns
        the logged trials' ids."""
        self.folder.mkdir(parents=True, exist_ok=True)
        ledger = self.folder / LEDGER
        logged = set(ledger.read_text().split()) if ledger.is_file() else set()
        self.runs = {t: f"{self.experiment_id}-{t}" for t in logged}
        prefix = f"{self.experiment_id}-"
        for path, run_id in self._run_folders().items():
            if run_id.startswith(prefix) and run_id[len(prefix):] not in logged:
                shutil.rmtree(path)  # this experiment's trial, cut off while being logged
        self._config, self._platforms, self._tuner = config, platforms, tuner
        return logged

    def log_trial(self, trial: TrialRecord, metrics: list[Metric], logs: dict[str, str]) -> None:
        """Log one ended trial as a run with its ``logs`` (file name -> text); listed in the ledger last."""
        if trial.id in self.runs:
            return
        run_id = f"{self.experiment_id}-{trial.id}"
        run = self._start(run_id, trial.id, "trial", flat_parameters(trial.parameters), [trial.status])
        try:
            for metric in metrics:
                if metric.type == "PERIODICAL" and (values := numbers(metric.value)):
                    run.log({f"intermediate/{k}": v for k, v in values.items()}, step=metric.sequence)
            started = trial.start_time or trial.submit_time
            summary: dict[str, Any] = {**numbers(trial.final), "trialflow.status": trial.status,
                                       "trialflow.sequence": trial.sequence, "trialflow.start_time": started,
                                       "trialflow.end_time": trial.end_time}
            if trial.end_time is not None and started is not None:
                summary["trialflow.duration"] = trial.end_time - started
            summary.update({k: v for k, v in (("trialflow.exit_code", trial.exit_code),
                                              ("trialflow.message", trial.message)) if v is not None})
            run.summary.update(summary)
            for name, text in logs.items():
                if text:
                    path = Path(run.dir) / "logs" / Path(name).name
                    path.parent.mkdir(exist_ok=True)
                    path.write_text(text, encoding="utf-8")
                    run.save(str(path), base_path=run.dir, policy="end")
        finally:
            run.finish(exit_code=0 if trial.status == TrialStatus.SUCCEEDED else 1)
        with (self.folder / LEDGER).open("a") as ledger:
            ledger.write(trial.id + "\n")
        self.runs[trial.id] = run_id

    def finish(self, record: ExperimentRecord) -> None:
        """Write the experiment's run: its config, status and final choice (an earlier end's run replaced)."""
        for path, run_id in self._run_folders().items():
            if run_id == self.experiment_id:
                shutil.rmtree(path)
        tags = [record.status] + ([self._tuner] if self._tuner else [])
        run = self._start(self.experiment_id, record.name or self.experiment_id, "experiment",
                          {"trialflow": self._config}, tags)
        summary: dict[str, Any] = {"trialflow.status": record.status, "trialflow.platform": self._platforms,
                                   "trialflow.trials_logged": len(self.runs), "trialflow.start_time": record.start_time,
                                   "trialflow.end_time": record.end_time or time.time()}
        if record.pareto is not None:
            summary["trialflow.pareto"] = sorted(record.pareto)
        elif record.best_trial:
            summary["trialflow.best_trial"] = record.best_trial
        run.summary.update(summary)
        run.finish(exit_code=0)

    def close(self) -> None:
        """Stop W&B's service process."""
        self.wandb.teardown()
