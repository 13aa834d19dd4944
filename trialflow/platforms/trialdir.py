"""The controller's side of the keeper/worker file protocol (names in ``trialflow.trial.protocol``):
reading a trial directory's metrics and logs, and the one mapping from a keeper's ``state`` record
to a :class:`TrialUpdate`. Local, remote (over SFTP, with the same mapping) and shared-storage
services use it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..trial.protocol import LOG_FILES, METRICS_FILE, OUTPUT_FILES
from ..trial.records import MetricRecord, parse_file_frames
from .base import TrialStatus, TrialUpdate

STDERR_TAIL_BYTES = 2000
READ_CHUNK = 4 * 1024 * 1024
NEVER_STARTED = "cancelled before it started"


def ended_update(state: dict[str, Any], records: list[MetricRecord], cursor: dict[str, Any], errors: list[str],
                 stderr_tail: str = "", cancelled: TrialStatus | None = None) -> TrialUpdate:
    """The update of a trial whose keeper recorded ``state`` (``{"exit_code": n | None}``): exit 0 is
    SUCCEEDED; no exit code means the trial was stopped before it started (SYS_CANCELED unless we
    cancelled it); any other code is FAILED with the stderr tail -- or the cancel reason when we
    stopped it (the status recorded first stays)."""
    code = state.get("exit_code")
    if code is None:
        return TrialUpdate(cancelled or TrialStatus.SYS_CANCELED, records, cursor, None, NEVER_STARTED, errors)
    code = int(code)
    if code == 0:
        return TrialUpdate(TrialStatus.SUCCEEDED, records, cursor, 0, None, errors)
    message = f"exit code {code}" + (f"; stderr tail:\n{stderr_tail}" if stderr_tail else "")
    return TrialUpdate(cancelled or TrialStatus.FAILED, records, cursor, code, message, errors)


def tail_text(path: str | Path, limit: int = STDERR_TAIL_BYTES) -> str:
    """The last ``limit`` bytes of a file as text ('' when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


def read_from(path: str | Path, offset: int) -> bytes:
    """Up to ``READ_CHUNK`` bytes of a file from ``offset`` (b'' when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(READ_CHUNK)
    except OSError:
        return b""


def read_metrics_file(trial_dir: str | Path, offset: int, trial_id: str) -> tuple[list[Any], list[str], int]:
    """Metric records of ``<trial dir>/.nni/metrics`` after byte ``offset``: (records, errors, new offset)."""
    path = os.path.join(trial_dir, METRICS_FILE)
    if not os.path.exists(path):
        return [], [], offset
    result = parse_file_frames(read_from(path, offset), offset, trial_id)
    return result.records, result.errors, result.offset


def read_trial_logs(trial_dir: str | Path, tail: int | None = None) -> dict[str, str]:
    """A trial directory's log files by name (the last ``tail`` bytes of each when given)."""
    out = {}
    for name in LOG_FILES:
        path = os.path.join(trial_dir, name)
        if os.path.exists(path):
            out[name] = tail_text(path, tail) if tail else Path(path).read_text("utf-8", "replace")
    return out


def read_output_files(trial_dir: str | Path, offsets: dict[str, int]) -> dict[str, bytes]:
    """What the trial's command printed after ``offsets`` (bytes per file name), by file name."""
    out = {}
    for name in OUTPUT_FILES:
        data = read_from(os.path.join(trial_dir, name), offsets.get(name, 0))
        if data:
            out[name] = data
    return out
