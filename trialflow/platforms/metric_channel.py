"""How a job platform's trials report metrics (``metricChannel``), one unit for every job platform.

* ``http``: the trial pushes to this controller's metrics receiver with a per-trial token; at the
  end of a trial its job logs fill any gap.
* ``logs``: metrics lines in the job's logs (in reuse mode, or where a platform's logs are the
  trial's stdout on the share: ``trial.stdout`` from where the last poll left off).
* ``file``: the trial's ``.nni/metrics`` file on the share.

Lifecycle: made with the service; :meth:`MetricChannel.start` in ``prepare()`` (``http``: the
receiver, its port kept in ``<experiment dir>/metrics-receiver.json`` so a resumed controller
listens where running jobs push); :meth:`read` in every poll and :meth:`delivered` once the poll
returned -- a poll that failed half-way re-reads its records, since nothing was marked seen and the
receiver is drained last; :meth:`forget` when a trial ends; :meth:`stop` in ``close()``. Records
are delivered once per (type, sequence) and trial.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..trial.procs import read_json, write_atomic
from ..trial.records import MetricRecord, parse_stdout_lines
from .errors import PlatformError
from .metrics_receiver import MetricsReceiver
from .trialdir import read_metrics_file

_KEEPER_CHANNEL = {"http": "http", "logs": "stdout", "file": "file"}
LogChunks = Callable[[dict[str, int]], dict[str, tuple[int, bytes]]]  # offsets -> {log: (start, new bytes)}


class MetricChannel:
    def __init__(self, name: str, manager_ip: str | None, experiment_dir: Path) -> None:
        self.name = name
        self.manager_ip = manager_ip
        self.experiment_dir = experiment_dir
        self.receiver: MetricsReceiver | None = None
        self._seen: dict[str, set[tuple[str, int]]] = {}

    def check_reachable(self, address: str, other_channels: str) -> None:
        """Jobs push to this machine's receiver, which binds loopback unless ``nniManagerIp`` is set:
        jobs of a platform elsewhere (``address``) could never reach it. Raises ``PlatformError``."""
        if self.name != "http" or self.manager_ip:
            return
        host = urlsplit(address).hostname or ""
        if host == "localhost" or _is_loopback(host):
            return
        raise PlatformError(
            f"nniManagerIp is not set, so the metrics receiver binds 127.0.0.1, which jobs of the cluster at "
            f"{address} cannot reach: set nniManagerIp to an address of this machine the jobs can reach, "
            f"or use {other_channels}")

    def start(self) -> None:
        if self.name != "http":
            return
        state = self.experiment_dir / "metrics-receiver.json"
        previous = read_json(str(state)) or {}
        self.receiver = MetricsReceiver(self.manager_ip or "127.0.0.1", int(previous.get("port") or 0)).start()
        self.experiment_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(str(state), {"port": self.receiver.port})

    def keeper_value(self) -> str:
        """``TRIALFLOW_METRIC_CHANNEL`` for the trial's keeper."""
        return _KEEPER_CHANNEL[self.name]

    @property
    def url(self) -> str | None:
        """Where jobs push metrics (None without the HTTP channel)."""
        return self.receiver.url if self.receiver is not None else None

    def token(self, store: Callable[[str], str], *trial_ids: str) -> str | None:
        """A token kept by ``store(new token) -> the stored one`` and granted ``trial_ids`` (None
        without the HTTP channel)."""
        if self.receiver is None:
            return None
        token = store(self.receiver.new_token())
        self.receiver.grant(token, *trial_ids)
        return token

    def grant(self, token: str | None, trial_id: str) -> None:
        if self.receiver is not None and token:
            self.receiver.grant(token, trial_id)

    def read(self, trial_id: str, trial_dir: Path, cursor: dict[str, Any], final: bool, log_chunks: LogChunks
             ) -> tuple[list[MetricRecord], list[str]]:
        """New metrics of the trial (``final``: its job ended), without duplicates; advances ``cursor``."""
        records: list[MetricRecord] = []
        errors: list[str] = []
        if self.name == "file":
            records, errors, cursor["metrics_offset"] = read_metrics_file(
                trial_dir, int(cursor.get("metrics_offset", 0)), trial_id)
        else:
            if self.name == "logs" or final:  # logs: the channel; http: the gap filler at the end
                offsets = dict(cursor.get("log_offsets") or {})
                for name, (start, data) in log_chunks(offsets).items():
                    result = parse_stdout_lines(data, start, trial_id)
                    records += result.records
                    errors += result.errors
                    offsets[name] = result.offset
                cursor["log_offsets"] = offsets
            if self.receiver is not None:  # last: drained records are not re-read if this poll failed
                records = self.receiver.drain(trial_id) + records
        seen = set(self._seen.get(trial_id, ()))
        fresh = []
        for record in records:
            if (record.type, record.sequence) not in seen:
                seen.add((record.type, record.sequence))
                fresh.append(record)
        return fresh, errors

    def delivered(self, trial_id: str, records: list[MetricRecord], ended: bool) -> None:
        seen = self._seen.setdefault(trial_id, set())
        seen.update((r.type, r.sequence) for r in records)
        if ended:
            self._seen.pop(trial_id, None)

    def track(self, trial_id: str) -> None:
        self._seen.setdefault(trial_id, set())

    def forget(self, trial_id: str) -> None:
        if self.receiver is not None:
            self.receiver.forget(trial_id)

    def stop(self) -> None:
        if self.receiver is not None:
            self.receiver.stop()
            self.receiver = None


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
