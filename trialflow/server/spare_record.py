"""The spare controller's record in the kept server's folder, for the commands that only look at it
(``trialflow server status``, ``trialflow server stop``). Standard library only."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import NamedTuple

from ..trial.procs import pid_alive, read_json

RECORD = "spare.json"  # in the kept server's folder: the ready spare's pid, start time, socket, output


class Spare(NamedTuple):
    pid: int
    start_time: int
    ready: bool  # listening (else still loading)


def recorded_spare(folder: Path) -> Spare | None:
    """The running spare recorded in the kept server's ``folder``, if any."""
    record = read_json(str(folder / RECORD)) or {}
    try:
        spare = Spare(int(record["pid"]), int(record["start_time"]), isinstance(record.get("socket"), str))
    except (KeyError, TypeError, ValueError):
        return None
    return spare if pid_alive(spare.pid, spare.start_time) else None


def stop_spare(folder: Path) -> None:
    """End the spare recorded in the kept server's ``folder`` (``trialflow server stop``), if any,
    and wait for it (a few seconds at most)."""
    spare = recorded_spare(folder)
    if spare is None:
        return
    with contextlib.suppress(OSError):
        os.kill(spare.pid, signal.SIGTERM)
    deadline = time.monotonic() + 5.0
    while pid_alive(spare.pid, spare.start_time) and time.monotonic() < deadline:
        time.sleep(0.02)
