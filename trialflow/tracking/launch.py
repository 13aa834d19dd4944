"""The controller's side of experiment tracking: it starts a tracking worker per tracker and tells them of ends.

:func:`tracking` is entered once the experiment's context is open and exited after its end is
recorded. For each tracker in the config (MLflow, W&B) it starts ``python -m trialflow.tracking.worker``
(its own session: Ctrl-C in the terminal stops the controller, which then finishes the worker) and
hands it the job on stdin, the login from the ``credentials`` block included (never in the worker's
arguments, environment at start, files or logs). :meth:`Tracking.trial_ended` is called from the
trials' task threads and never blocks or raises: a thread of its own reads the trial's log files
through the service once and sends them to every worker. At exit it tells the workers to finish and
waits while they log (each at most :data:`FLUSH_SECONDS` without a trial logged or, with MLflow, a
request answered: a slow tracker is waited for, one that answers nothing is not); what is still
unlogged then is logged at the experiment's next run. The workers' lines go to the
``trialflow.tracking`` logger (the terminal and the experiment's log). A tracker never fails the
experiment; a missing credentials block does, at start (:class:`BlockNotFoundError`).
"""

from __future__ import annotations

import json
import logging
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from ..config import ExperimentConfig
from ..platforms import TrainingService, TrialHandle
from ..records.store import ExperimentStore
from .worker import ANSWERED, MAX_LOG_BYTES, PROGRESS

log = logging.getLogger("trialflow.tracking")
FLUSH_SECONDS = 60.0  # at the end: how long the worker may go with no trial logged, no request answered
# the MLflow client's own retries would hold the worker for minutes on a tracker that is down: it
# retries itself, with its own backoff, and says so once
MLFLOW_SETTINGS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "15",
                   "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}
WANDB_SETTINGS = {"WANDB_SILENT": "true", "WANDB_CONSOLE": "off"}
_LEVELS = {"INFO": logging.INFO, "WARNING": logging.WARNING}


class _Worker:
    """One tracker's worker process: what is sent to it, what it says, how long it may take at the end."""

    def __init__(self, job: dict[str, Any], experiment_id: str) -> None:
        self.experiment_id = experiment_id
        self.proc = subprocess.Popen([sys.executable, "-m", "trialflow.tracking.worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        self.lost = False
        self.progress = time.monotonic()  # when the worker last logged a trial
        assert self.proc.stderr is not None
        self.relay_thread = threading.Thread(target=self._relay, args=(self.proc.stderr,), daemon=True,
                                             name="tracking-relay")
        self.relay_thread.start()
        self.send(job)

    def _relay(self, stream: IO[str]) -> None:
        for line in stream:
            level, _, message = line.rstrip("\n").partition(" ")
            if level in (PROGRESS, ANSWERED):
                self.progress = time.monotonic()
            elif level in _LEVELS:
                log.log(_LEVELS[level], "experiment %s: %s", self.experiment_id, message)
            else:  # the client's own warnings, a traceback
                log.debug("tracking worker: %s", line.rstrip("\n"))

    def send(self, message: dict[str, Any]) -> None:
        if self.lost:
            return
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(message) + "\n")
            self.proc.stdin.flush()
        except (OSError, ValueError):
            self.lost = True
            log.warning("experiment %s: its tracking worker ended (exit %s); the trials not logged yet are "
                        "logged when the experiment runs again", self.experiment_id, self.proc.poll())

    def finish(self) -> None:
        """Tell the worker the experiment's end is recorded; it exits once everything is logged."""
        self.send({"finish": True})
        self.lost = True
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        self.progress = time.monotonic()

    def done(self) -> bool:
        """Whether the worker exited; one that logged no trial and had no request answered for
        :data:`FLUSH_SECONDS` is stopped."""
        if self.proc.poll() is not None:
            return True
        if time.monotonic() - self.progress <= FLUSH_SECONDS:
            return False
        self.proc.kill()
        self.proc.wait()
        log.warning("experiment %s: its tracker took no trial for %.0f s; the rest are logged when the "
                    "experiment runs again", self.experiment_id, FLUSH_SECONDS)
        return True


class Tracking:
    def __init__(self, workers: list[_Worker], experiment_id: str, store: ExperimentStore,
                 service: TrainingService) -> None:
        self.workers = workers
        self.experiment_id = experiment_id
        self.store = store
        self.service = service
        self._ended: queue.Queue[str | None] = queue.Queue()
        self._sender = threading.Thread(target=self._send_ended, daemon=True, name="tracking-sender")
        self._sender.start()

    def _logs(self, trial_id: str) -> dict[str, str]:
        """The trial's log files as its service reads them (their ends); empty when it cannot."""
        try:
            handle = self.store.trial(trial_id).handle
            return self.service.logs(TrialHandle.from_dict(handle), tail=MAX_LOG_BYTES) if handle else {}
        except Exception as exc:  # noqa: BLE001 -- the run is logged without them
            log.debug("experiment %s: trial %s's logs for the tracker: %s", self.experiment_id, trial_id, exc)
            return {}

    def _send_ended(self) -> None:
        while (trial_id := self._ended.get()) is not None:
            message = {"trial": trial_id, "logs": self._logs(trial_id)}
            for worker in self.workers:
                worker.send(message)

    def trial_ended(self, trial_id: str) -> None:
        self._ended.put(trial_id)

    def finish(self) -> None:
        """Tell the workers the experiment's end is recorded and wait for them (bounded)."""
        self._ended.put(None)
        self._sender.join()
        for worker in self.workers:
            worker.finish()
        waiting = list(self.workers)
        while waiting := [w for w in waiting if not w.done()]:
            time.sleep(0.1)
        for worker in self.workers:
            worker.relay_thread.join(timeout=5)


def _jobs(experiment_id: str, config: ExperimentConfig, exp_dir: Path) -> list[dict[str, Any]]:
    """A worker's job per tracker in the config (without what every job has)."""
    from ..blocks import MLflowCredentials, WandbCredentials, load_block

    def environment(settings: dict[str, str], block_type: Any, block: str | None) -> dict[str, str]:
        """The client's settings and, when the section names a credentials block, its login."""
        return {**settings, **(load_block(block_type, block).environment() if block else {})}

    jobs = []
    if config.tracking and (mlflow := config.tracking.mlflow):
        name = mlflow.experiment_name or config.experiment_name or "trialflow"
        jobs.append({"tracker": "mlflow", "environment": environment(MLFLOW_SETTINGS, MLflowCredentials,
                                                                     mlflow.credentials),
                     "settings": {"tracking_uri": mlflow.tracking_uri, "mlflow_experiment": name}})
    if config.tracking and (wandb := config.tracking.wandb):
        jobs.append({"tracker": "wandb", "environment": environment(WANDB_SETTINGS, WandbCredentials,
                                                                    wandb.credentials),
                     "settings": {"folder": str(exp_dir / "wandb"), "project": wandb.project, "mode": wandb.mode,
                                  "entity": wandb.entity}})
    return jobs


@contextmanager
def tracking(experiment_id: str, exp_dir: Path, config: ExperimentConfig, store: ExperimentStore,
             service: TrainingService) -> Iterator[Tracking | None]:
    """The experiment's tracking workers while the block runs (None when the config names no tracker);
    ``service`` reads ended trials' logs, so it stays open until the block ends."""
    jobs = _jobs(experiment_id, config, exp_dir)
    if not jobs:
        yield None
        return
    tuner = config.tuner or config.advisor
    shared = {"experiment_id": experiment_id, "started": time.time(), "store_url": store.url,
              "config": config.dump(), "platforms": ",".join(s.platform for s in config.services),
              "tuner": tuner.label if tuner else None}
    tracker = Tracking([_Worker({**shared, **job}, experiment_id) for job in jobs], experiment_id, store, service)
    try:
        yield tracker
    finally:
        tracker.finish()
