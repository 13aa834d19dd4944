"""Process helpers shared by the controller and workers (standard library only, Linux ``/proc``).

``kill_group`` stops a whole trial: SIGINT, then SIGTERM, then SIGKILL to its process group, a
grace period apart. ``pid_alive`` treats zombies as dead; ``process_start_time`` guards against a
recycled pid (a pid plus its start time names one process for good).
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any


def write_atomic(path: str, data: dict[str, Any]) -> None:
    """Write JSON so that readers see the old file or the whole new one, never a part."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22)."""
    fields = _stat_fields(pid)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def pid_alive(pid: int, start_time: int | None = None) -> bool:
    """True while ``pid`` runs and is not a zombie (and, when given, started at ``start_time``)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = _stat_fields(pid)
    if fields is None:
        return True  # no /proc: trust kill(0)
    if fields[0] == "Z":
        return False
    return start_time is None or process_start_time(pid) == start_time


def group_alive(pgid: int) -> bool:
    """True while any non-zombie process is in the group (an exited keeper's zombie does not count)."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            try:
                if fields and int(fields[2]) == pgid and fields[0] != "Z":
                    return True
            except (IndexError, ValueError):
                continue
    return False


def kill_group(pgid: int, grace: float) -> None:
    """SIGINT, SIGTERM, then SIGKILL to the process group ``pgid``, ``grace`` seconds apart."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if not group_alive(pgid):
                return
            time.sleep(0.02)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
