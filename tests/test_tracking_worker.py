"""The tracking worker's retries, in process, with a tracker that is down and comes back: what it
gives a tracker at the experiment's end does not depend on how long the tracker was down before."""

from __future__ import annotations

import io
import os
import sys
import threading
import time
from types import SimpleNamespace

from trialflow.tracking import mlflow_runs, worker


class _Tracker:
    """A tracker whose first ``down`` connects fail (it is down), then answer; the try numbered
    ``gate`` fails only once ``finish_sent`` is set, so the tries after it follow the finish."""

    where = "a test tracker"

    def __init__(self, down: int, gate: int) -> None:
        self.down, self.gate, self.tries, self.runs, self.finished = down, gate, 0, {}, False
        self.finish_sent = threading.Event()

    def connect(self, record, config, platforms, tuner) -> set[str]:
        self.tries += 1
        if self.tries == self.gate:
            self.finish_sent.wait(10)
        if self.tries <= self.down:
            raise ConnectionError("connection refused")
        return set()

    def log_trial(self, trial, metrics, logs) -> None:
        self.runs[trial.id] = trial.id

    def finish(self, record) -> None:
        self.finished = True

    def close(self) -> None:
        pass


class _Store:
    def experiment(self):
        return SimpleNamespace(status="DONE")

    def trials(self):
        return []


def test_a_tracker_back_at_the_end_gets_its_tries_however_long_it_was_down(monkeypatch, capsys):
    """Down for six tries while the experiment ran, down for one more after its end: the worker
    tries again (its tries at the end count from the end) and logs, instead of giving up at once."""
    monkeypatch.setattr(worker, "MAX_BACKOFF_SECONDS", 0.02)
    read, write = os.pipe()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(os.fdopen(read, "rb")))
    tracker = _Tracker(down=7, gate=6)  # tries 1-6 while it runs, 7 after its end fails too, 8 answers
    job = {"config": {}, "platforms": "local", "tuner": None, "started": time.time()}
    outcome: list[int] = []
    thread = threading.Thread(target=lambda: outcome.append(worker._log(job, _Store(), tracker)), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while tracker.tries < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    with os.fdopen(write, "w") as stdin:
        stdin.write('{"finish": true}\n')
    tracker.finish_sent.set()
    thread.join(timeout=10)
    assert outcome == [0] and tracker.finished and tracker.tries == 8
    said = capsys.readouterr().err
    assert said.count("cannot log this experiment now") == 1 and "answers again" in said


def test_each_answered_mlflow_call_tells_the_controller_the_tracker_is_slow_not_gone():
    answered: list[int] = []
    client = mlflow_runs._Answering(SimpleNamespace(get_experiment_by_name=lambda name: None, tracking_uri="u"),
                                    lambda: answered.append(1))
    assert client.get_experiment_by_name("x") is None and client.tracking_uri == "u"
    assert answered == [1]
