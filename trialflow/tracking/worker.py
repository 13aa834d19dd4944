"""The tracking worker: a process beside the controller that logs the experiment's record to one tracker.

``python -m trialflow.tracking.worker`` reads JSON lines on stdin: first the job (experiment id, the
store's URL, which tracker (``mlflow`` or ``wandb``) and its settings, the client's environment with
the login), then
``{"trial": id, "logs": {file name: text}}`` when a trial's end is recorded (its log files as its
service read them) and ``{"finish": true}`` once the experiment's end is. It logs from the record,
never from what the controller holds: on connecting it also logs every trial that ended before this
run and is not logged yet, and at the finish every ended trial still unlogged (their log files read
from their folders when those are on this machine). A tracker that does not answer is retried with
backoff and said once (``WARNING ...`` on stderr, which the controller logs), and again when it
answers; ``LOGGED <trial id>`` follows each trial logged, and ``ANSWERED`` a request the tracker
answered (at most one a second; MLflow only). It exits after ``finish`` (0 once everything is logged,
2 when the tracker still does not answer after :data:`FINISH_TRIES` tries since the finish), or at
once when stdin closes before it (its controller is gone: what is left is logged at the experiment's
next run). Apart from those lines it prints nothing; the login reaches only this process's
environment.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..records.store import ExperimentRecord, ExperimentStore, Metric, TrialRecord

MAX_BACKOFF_SECONDS = 30.0
BACKLOG_SAID = 20  # trials left to log at the experiment's end from which the wait is said
PROGRESS = "LOGGED"  # the line after each trial logged: the controller waits while they come
ANSWERED = "ANSWERED"  # the line after a request the tracker answered: it is slow, not gone
MAX_LOG_BYTES = 2 * 1024 * 1024  # the end of each log file a tracker gets; the whole stays with the trial
FINISH_TRIES = 4  # tries after the experiment ended (backoff from 1 s), then the next run logs the rest
_EOF = object()


def say(level: str, message: str) -> None:
    """One line for the controller's log (``level`` is a logging level name)."""
    print(f"{level} {message}", file=sys.stderr, flush=True)


class TrackerRuns(Protocol):
    """One tracker's runs (:class:`~.mlflow_runs.MlflowRuns`, :class:`~.wandb_runs.WandbRuns`)."""

    where: str  # the tracker, as the lines the controller logs name it
    runs: dict[str, str]  # trial id -> its run, for the trials logged

    def connect(self, record: ExperimentRecord, config: dict[str, Any], platforms: str,
                tuner: str | None) -> set[str]: ...
    def log_trial(self, trial: TrialRecord, metrics: list[Metric], logs: dict[str, str]) -> None: ...
    def finish(self, record: ExperimentRecord) -> None: ...
    def close(self) -> None: ...


def open_runs(job: dict[str, Any]) -> TrackerRuns:
    """The job's tracker, its client made (nothing sent yet)."""
    if job["tracker"] == "wandb":
        from .wandb_runs import WandbRuns

        return WandbRuns(job["experiment_id"], **job["settings"])
    from .mlflow_runs import MlflowRuns

    return MlflowRuns(job["experiment_id"], **job["settings"], answered=_Answers().say)


class _Answers:
    """Says ``ANSWERED`` after a request the tracker answered, at most once a second."""

    def __init__(self) -> None:
        self._said = float("-inf")

    def say(self) -> None:
        if time.monotonic() - self._said >= 1.0:
            self._said = time.monotonic()
            say(ANSWERED, "")


def _read_lines(inbox: queue.Queue[Any]) -> None:
    for line in sys.stdin:
        if line.strip():
            inbox.put(json.loads(line))
    inbox.put(_EOF)


def run(job: dict[str, Any]) -> int:
    """Log until finished (0) or until stdin closes (1)."""
    from ..records.store import ExperimentStore

    store = ExperimentStore(job["store_url"], job["experiment_id"])
    runs = open_runs(job)
    try:
        return _log(job, store, runs)
    finally:
        runs.close()


def _log(job: dict[str, Any], store: ExperimentStore, runs: TrackerRuns) -> int:
    from ..foundation.status import TrialStatus
    from ..platforms.trialdir import read_trial_logs

    inbox: queue.Queue[Any] = queue.Queue()
    threading.Thread(target=_read_lines, args=(inbox,), daemon=True).start()
    pending: set[str] = set()
    logs: dict[str, dict[str, str]] = {}  # trial id -> its log files, as its service read them
    finishing = connected = False
    failures = finish_failures = 0  # failed tries in a row; of them, those since the finish
    where = runs.where
    while True:
        if failures:
            wait: float | None = min(MAX_BACKOFF_SECONDS, 0.5 * 2 ** (finish_failures if finishing else failures))
        else:
            wait = 0 if not connected or pending or finishing else None
        try:
            message = inbox.get(timeout=wait)
        except queue.Empty:
            message = None
        while message is not None:
            if message is _EOF:
                if not finishing:  # the controller is gone: the next run logs the rest
                    return 1
                break
            if "trial" in message:
                pending.add(message["trial"])
                logs[message["trial"]] = message.get("logs") or {}
            finishing = finishing or bool(message.get("finish"))
            try:
                message = inbox.get_nowait()
            except queue.Empty:
                message = None
        try:
            if not connected:
                logged = runs.connect(store.experiment(), job["config"], job["platforms"], job["tuner"])
                # what an earlier run left unlogged; a trial ending in this run comes with its logs
                pending |= {t.id for t in store.trials() if t.is_terminal and not t.stopping and t.id not in logged
                            and (t.end_time or 0) < job["started"]}
                connected = True
            if finishing:  # a trial whose end was recorded without a word from the controller
                pending |= {t.id for t in store.trials() if t.is_terminal and not t.stopping and t.id not in runs.runs}
                if len(pending) >= BACKLOG_SAID and failures == 0:
                    say("INFO", f"{where}: logging the last {len(pending)} ended trials")
            for trial in sorted((store.trial(i) for i in pending), key=lambda t: t.sequence):
                if TrialStatus(trial.status).is_terminal:
                    output = logs.get(trial.id) or (read_trial_logs(trial.log_dir, MAX_LOG_BYTES) if trial.log_dir
                                                    and os.path.isdir(trial.log_dir) else {})
                    runs.log_trial(trial, store.metrics(trial.id), output)
                    say(PROGRESS, trial.id)
                pending.discard(trial.id)
                logs.pop(trial.id, None)
            if finishing:
                runs.finish(store.experiment())
            if failures:
                say("INFO", f"{where} answers again: every ended trial is logged")
            if finishing:
                return 0
            failures = 0
        except Exception as exc:  # noqa: BLE001 -- whatever the client raises: retried, said once
            connected = False  # reconnecting deletes a trial's run that was cut off while being logged
            if failures == 0:
                reason = " ".join(str(exc).split())[:300]
                say("WARNING", f"{where} cannot log this experiment now ({type(exc).__name__}: {reason}); "
                               "its trials are logged when it answers again")
            failures += 1
            finish_failures += finishing
            if finishing and finish_failures >= FINISH_TRIES:
                say("WARNING", f"{where}: the trials not logged yet are logged when the experiment runs again")
                return 2


def main() -> int:
    line = sys.stdin.readline()
    if not line.strip():
        return 1
    job = json.loads(line)
    os.environ.update(job["environment"])  # the client's settings and login: this process (and its children) only
    sys.stdout = open(os.devnull, "w")  # clients print run links; the controller reads stderr only
    return run(job)


if __name__ == "__main__":
    sys.exit(main())
