"""Pushing metric records to the experiment's metrics receiver over HTTP (standard library only).

Used by the trial runtime when ``TRIALFLOW_METRIC_CHANNEL=http``: ``TRIALFLOW_METRICS_URL`` is the
receiver's base URL and ``TRIALFLOW_METRICS_TOKEN`` this trial's token (delivered as a Kubernetes
Secret, or as a file on the share named by ``TRIALFLOW_METRICS_TOKEN_FILE``; never in a manifest).
Reporting never blocks on the network: records are queued and a background thread sends whatever
has accumulated in one request (``POST <url>/metrics/<trial id>``, one kept-alive connection),
retrying connection errors, 5xx and 429 with backoff. At exit the queue is flushed for up to
``FLUSH_SECONDS``. A batch the receiver refuses (4xx) is dropped with a note on stderr: the same
records also went out as stdout marker lines, which the controller reads from the pod's log (or the
trial's stdout on the share), so nothing depends on this channel alone.
"""

from __future__ import annotations

import atexit
import json
import sys
import threading
import time

from .receiver_http import ReceiverConnection

FLUSH_SECONDS = 10.0
MAX_BATCH_BYTES = 512 * 1024


class MetricPusher:
    def __init__(self, url: str, token: str, trial_id: str) -> None:
        self._receiver = ReceiverConnection(url, token, timeout=10)
        self.path = f"/metrics/{trial_id}"
        self._pending: list[str] = []
        self._cond = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._loop, name="trialflow-metrics", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def push(self, record_json: str) -> None:
        with self._cond:
            self._pending.append(record_json)
            self._cond.notify()

    def close(self, timeout: float = FLUSH_SECONDS) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)

    def _loop(self) -> None:
        delay = 0.05
        while True:
            with self._cond:
                while not self._pending and not self._closing:
                    self._cond.wait()
                if not self._pending:
                    return
                batch: list[str] = []
                size = 0
                while self._pending and (not batch or size + len(self._pending[0]) < MAX_BATCH_BYTES):
                    size += len(self._pending[0]) + 1
                    batch.append(self._pending.pop(0))
            status = self._send(batch)
            if status in (None, 429) or status >= 500:
                with self._cond:
                    self._pending[:0] = batch
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            delay = 0.05
            if status >= 400:
                print(f"trialflow: the metrics receiver refused {len(batch)} record(s) (HTTP {status}); "
                      "they are still in this trial's output", file=sys.stderr, flush=True)

    def _send(self, batch: list[str]) -> int | None:
        answer = self._receiver.request("POST", self.path, json.dumps({"metrics": batch}).encode())
        return None if answer is None else answer[0]
