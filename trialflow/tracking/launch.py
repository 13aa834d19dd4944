"""The controller's side of experiment tracking: it starts the tracking worker and tells it of ends.

:func:`tracking` is entered once the experiment's context is open and exited after its end is
recorded. It starts ``python -m trialflow.tracking.worker`` (its own session: Ctrl-C in the terminal
stops the controller, which then finishes the worker) and hands it the job on stdin, the login from
the ``credentials`` block included (never in the worker's arguments, environment at start, files or
logs). :meth:`Tracking.trial_ended` is called from the trials' task threads and never blocks or
raises: a thread of its own reads the trial's log files through the service and sends them on. At
exit it tells the worker to finish and waits while it logs (at most :data:`FLUSH_SECONDS` without a
trial logged); what is still unlogged then is logged at the experiment's next run. The worker's
lines go to the ``trialflow.tracking`` logger (the terminal and the experiment's log). A tracker
never fails the experiment; a missing credentials block does, at start
(:class:`BlockNotFoundError`).
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
from typing import IO, Any

from ..config import ExperimentConfig
from ..platforms import TrainingService, TrialHandle
from ..store import ExperimentStore
from .worker import MAX_LOG_BYTES, PROGRESS

log = logging.getLogger("trialflow.tracking")
FLUSH_SECONDS = 60.0  # at the end: how long the worker may log nothing before it is stopped
# the MLflow client's own retries would hold the worker for minutes on a tracker that is down: it
# retries itself, with its own backoff, and says so once
CLIENT_SETTINGS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "15",
                   "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}
_LEVELS = {"INFO": logging.INFO, "WARNING": logging.WARNING}


class Tracking:
    def __init__(self, proc: subprocess.Popen[str], experiment_id: str, store: ExperimentStore,
                 service: TrainingService) -> None:
        self.proc = proc
        self.experiment_id = experiment_id
        self.store = store
        self.service = service
        self._ended: queue.Queue[str | None] = queue.Queue()
        self._lost = False
        self._progress = time.monotonic()  # when the worker last logged a trial
        self._relay_thread = threading.Thread(target=self._relay, args=(proc.stderr,), daemon=True,
                                              name="tracking-relay")
        self._relay_thread.start()
        self._sender = threading.Thread(target=self._send_ended, daemon=True, name="tracking-sender")
        self._sender.start()

    def _relay(self, stream: IO[str]) -> None:
        for line in stream:
            level, _, message = line.rstrip("\n").partition(" ")
            if level == PROGRESS:
                self._progress = time.monotonic()
            elif level in _LEVELS:
                log.log(_LEVELS[level], "experiment %s: %s", self.experiment_id, message)
            else:  # the client's own warnings, a traceback
                log.debug("tracking worker: %s", line.rstrip("\n"))

    def _send(self, message: dict[str, Any]) -> None:
        if self._lost:
            return
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(message) + "\n")
            self.proc.stdin.flush()
        except (OSError, ValueError):
            self._lost = True
            log.warning("experiment %s: its tracking worker ended (exit %s); the trials not logged yet are "
                        "logged when the experiment runs again", self.experiment_id, self.proc.poll())

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
            self._send({"trial": trial_id, "logs": self._logs(trial_id)})

    def trial_ended(self, trial_id: str) -> None:
        self._ended.put(trial_id)

    def finish(self) -> None:
        """Tell the worker the experiment's end is recorded and wait for it (bounded)."""
        self._ended.put(None)
        self._sender.join()
        self._send({"finish": True})
        self._lost = True
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        self._progress = time.monotonic()
        while self.proc.poll() is None:
            if time.monotonic() - self._progress > FLUSH_SECONDS:
                self.proc.kill()
                self.proc.wait()
                log.warning("experiment %s: its tracker took no trial for %.0f s; the rest are logged when the "
                            "experiment runs again", self.experiment_id, FLUSH_SECONDS)
                break
            time.sleep(0.1)
        self._relay_thread.join(timeout=5)


@contextmanager
def tracking(experiment_id: str, config: ExperimentConfig, store: ExperimentStore,
             service: TrainingService) -> Iterator[Tracking | None]:
    """The experiment's tracking worker while the block runs (None when the config names no tracker);
    ``service`` reads ended trials' logs, so it stays open until the block ends."""
    section = config.tracking.mlflow if config.tracking else None
    if section is None:
        yield None
        return
    environment = dict(CLIENT_SETTINGS)
    if section.credentials:
        from ..blocks import MLflowCredentials, load_block

        environment.update(load_block(MLflowCredentials, section.credentials).environment())
    tuner = config.tuner or config.advisor
    job = {"experiment_id": experiment_id, "started": time.time(), "store_url": store.url,
           "tracking_uri": section.tracking_uri,
           "mlflow_experiment": section.experiment_name or config.experiment_name or "trialflow",
           "config": config.dump(), "platforms": ",".join(s.platform for s in config.services),
           "tuner": tuner.label if tuner else None, "environment": environment}
    proc = subprocess.Popen([sys.executable, "-m", "trialflow.tracking.worker"], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    tracker = Tracking(proc, experiment_id, store, service)
    tracker._send(job)
    try:
        yield tracker
    finally:
        tracker.finish()
