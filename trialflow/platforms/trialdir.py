"""The controller's side of the keeper/worker file protocol (names in ``trialflow.trial.protocol``),
written once over the filesystem seam (:class:`~.trialfs.TrialFS`): reading a trial directory
(:func:`read_trial`, logs, output), the one mapping from a keeper's ``state`` record to a
:class:`TrialUpdate`, a reuse environment's boxes and heartbeat (:class:`EnvironmentDir`), and
installing the runtime and code bundles into place (a ``.partial`` folder renamed when whole, so
concurrent installers never see half of one). Local, remote and shared-storage services use it.
"""

from __future__ import annotations

import json
import os
import posixpath
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..records.codebundle import CodeBundle, CodeDirError, scan_code_dir
from ..trial.protocol import (
    HEARTBEAT,
    HOLD,
    KEEPER_NOTE,
    KEEPER_SPEC,
    KILL,
    LOG_FILES,
    META_DIR,
    METRICS,
    OUTPUT_FILES,
    QUEUE,
    STATE,
    STDERR_FILE,
    STOP,
    TAKEN,
    WORKER_INFO,
    with_stderr_tail,
)
from ..trial.records import MetricRecord, parse_file_frames
from .base import PlatformError, TrialStatus, TrialUpdate
from .trialfs import READ_CHUNK, Feed, LocalFS, TrialFS

STDERR_TAIL_BYTES = 2000
NEVER_STARTED = "cancelled before it started"
LOCAL = LocalFS()


def ended_update(state: dict[str, Any], records: list[MetricRecord], cursor: dict[str, Any], errors: list[str],
                 stderr_tail: str = "", cancelled: TrialStatus | None = None) -> TrialUpdate:
    """The update of a trial whose keeper recorded ``state`` (``{"exit_code": n | None}``): exit 0 is
    SUCCEEDED; no exit code means the trial was stopped before it started (SYS_CANCELED unless we
    cancelled it); any other code is FAILED with the stderr tail -- or the cancel reason when we
    stopped it (the status recorded first stays). A trial that exited after a stop signal reached it
    (``stop_signal``: ours, or the system's) ended by the stop, whatever its code -- one that handles
    SIGINT, or was still starting, exits with a code of its own: the cancel reason (SYS_CANCELED when
    the signal was not ours), and instead of that code (in the message) none; a trial the signal
    killed keeps its ``128 + n``."""
    code = state.get("exit_code")
    if code is None:
        return TrialUpdate(cancelled or TrialStatus.SYS_CANCELED, records, cursor, None, NEVER_STARTED, errors)
    code = int(code)
    if answered_stop(state):
        return TrialUpdate(cancelled or TrialStatus.SYS_CANCELED, records, cursor, None,
                           f"exit code {code} after a stop signal", errors)
    if code == 0:
        return TrialUpdate(TrialStatus.SUCCEEDED, records, cursor, 0, None, errors)
    message = with_stderr_tail(f"exit code {code}", stderr_tail)
    return TrialUpdate(cancelled or TrialStatus.FAILED, records, cursor, code, message, errors)


def recorded_exit_code(state: dict[str, Any]) -> int | None:
    """The exit code in the keeper's record ``state``; None until it has one."""
    code = state.get("exit_code")
    return code if isinstance(code, int) else None


def answered_stop(state: dict[str, Any]) -> bool:
    """Whether the trial's recorded exit (its keeper's ``state``) answered a stop signal that reached it
    while it ran: a code of its own (0-127) with ``stop_signal``. That code is not the trial's own end;
    a code >= 128 (killed by the signal) says so itself."""
    code = recorded_exit_code(state)
    return bool(state.get("stop_signal")) and code is not None and 0 <= code < 128


def keeper_identity(record: Any) -> tuple[int, int] | None:
    """(pid, start time) from a keeper's process record (``keeper.pid``'s form: what ``keeper --submit``
    prints, what a reuse worker notes); None when either is missing or not an integer (a pid without its
    start time cannot be told from a later process that took it)."""
    try:
        return int(record["pid"]), int(record["start_time"])
    except (KeyError, TypeError, ValueError):
        return None


def read_json(fs: TrialFS, path: str) -> dict[str, Any] | None:
    """A JSON object file; None when it is missing or not (yet) a whole object."""
    data = fs.read(path)
    try:
        value = json.loads(data) if data else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def set_aside_earlier_run(fs: TrialFS, trial_dir: str, attempt: int) -> None:
    """Before run ``attempt`` (n >= 1) of a trial is written: the meta directory of the run before it
    moves to ``.nni-<its attempt>``, so the new run's keeper starts clean (its own lock, state and
    metrics) while the earlier run's records stay to read; ``checkpoint/`` and the trial's other files
    stay where they are. Idempotent: a meta directory already of this attempt is left."""
    meta = posixpath.join(trial_dir, META_DIR)
    if not attempt or not fs.exists(meta):
        return
    earlier = int((read_json(fs, posixpath.join(meta, KEEPER_SPEC)) or {}).get("attempt", 0))
    if earlier < attempt:
        fs.rename(meta, f"{meta}-{earlier}")


def tail_text(path: str | Path, limit: int = STDERR_TAIL_BYTES, fs: TrialFS = LOCAL) -> str:
    """The last ``limit`` bytes of a file as text ('' when it cannot be read)."""
    return fs.tail(str(path), limit).decode("utf-8", "replace").strip()


@dataclass
class TrialFiles:
    """One look at a trial directory: its meta entries, the keeper's end record, new metrics."""

    names: set[str] | None  # entries of ``.nni/``; None when the trial directory is gone
    state: dict[str, Any] | None = None
    records: list[MetricRecord] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    offset: int = 0
    stderr_tail: str = ""

    def update(self, cursor: dict[str, Any], cancelled: TrialStatus | None = None) -> TrialUpdate:
        """The ended trial's update (``state`` is set)."""
        assert self.state is not None
        return ended_update(self.state, self.records, cursor, self.errors, self.stderr_tail, cancelled)


def read_trial(fs: TrialFS, trial_dir: str, offset: int, trial_id: str, metrics: bool = True) -> TrialFiles:
    """The trial's state, then its metrics after byte ``offset`` (every metric precedes the state, so
    once the state is there all of them are read), and the stderr tail of an ended trial."""
    meta = fs.join(trial_dir, META_DIR)
    names = fs.listdir(meta)
    if names is None:
        return TrialFiles(None, offset=offset)
    found = TrialFiles(set(names), offset=offset)
    found.state = read_json(fs, fs.join(meta, STATE)) if STATE in names else None
    size = names.get(METRICS, 0) if metrics else 0
    while size > found.offset:
        result = parse_file_frames(fs.read(fs.join(meta, METRICS), found.offset) or b"", found.offset, trial_id)
        found.records += result.records
        found.errors += result.errors
        moved, found.offset = result.offset != found.offset, result.offset
        if not moved or found.state is None:
            break
    if found.state is not None:
        found.stderr_tail = tail_text(fs.join(trial_dir, STDERR_FILE), fs=fs)
    return found


def read_metrics_file(trial_dir: str | Path, offset: int, trial_id: str, fs: TrialFS = LOCAL
                      ) -> tuple[list[Any], list[str], int]:
    """Metric records of ``<trial dir>/.nni/metrics`` after byte ``offset``: (records, errors, new offset)."""
    data = fs.read(fs.join(str(trial_dir), META_DIR, METRICS), offset)
    if not data:
        return [], [], offset
    result = parse_file_frames(data, offset, trial_id)
    return result.records, result.errors, result.offset


def read_from(path: str | Path, offset: int, fs: TrialFS = LOCAL) -> bytes:
    """Up to ``READ_CHUNK`` bytes of a file from ``offset`` (b'' when it cannot be read)."""
    return fs.read(str(path), offset, READ_CHUNK) or b""


def read_trial_logs(trial_dir: str | Path, tail: int | None = None, fs: TrialFS = LOCAL) -> dict[str, str]:
    """A trial directory's log files by name (the last ``tail`` bytes of each when given)."""
    out = {}
    for name in LOG_FILES:
        path = fs.join(str(trial_dir), name)
        if fs.exists(path):
            out[name] = tail_text(path, tail, fs) if tail else (fs.read(path, 0, -1) or b"").decode(
                "utf-8", "replace")
    return out


def read_output_files(trial_dir: str | Path, offsets: dict[str, int], fs: TrialFS = LOCAL) -> dict[str, bytes]:
    """What the trial's command printed after ``offsets`` (bytes per file name), by file name."""
    out = {}
    for name in OUTPUT_FILES:
        data = read_from(fs.join(str(trial_dir), name), offsets.get(name, 0), fs)
        if data:
            out[name] = data
    return out


def install_tree(fs: TrialFS, target: str, files: list[tuple[str, Path]]) -> None:
    """Copy ``files`` (relative name, local source) to the folder ``target`` unless it exists."""
    if fs.listdir(target) is not None:
        return
    partial = f"{target}.partial-{os.getpid()}-{time.time_ns()}"
    for rel, source in files:
        dest = fs.join(partial, rel)
        fs.makedirs(posixpath.dirname(dest))
        fs.put(source, dest)
    try:
        fs.rename(partial, target)
    except OSError:
        fs.remove_tree(partial)
        if fs.listdir(target) is None:
            raise


def scan_bundle(code_dir: Path, experiment_dir: Path) -> tuple[CodeBundle, str]:
    """The code directory as a bundle and its content hash (cached in ``.cache`` beside the
    experiment folders); a directory over the upload limits is a ``PlatformError`` naming why."""
    try:
        bundle = scan_code_dir(code_dir)
    except CodeDirError as exc:
        raise PlatformError(str(exc)) from None
    return bundle, bundle.content_hash(experiment_dir.parent / ".cache" / "bundle-hashes.json")


def install_code(fs: TrialFS, target: str, digest: str, feed: Feed) -> int:
    """Extract a code bundle into ``target`` unless it is there; returns the bytes sent."""
    if fs.exists(target):
        return 0
    fs.makedirs(posixpath.dirname(target))
    return fs.extract(target, digest, feed)


class EnvironmentDir:
    """A reuse environment's folder as the controller uses it (the worker's side is
    ``trialflow.trial.worker``): trials queued as payload files (``hold/`` while they wait for GPU
    slots), cancels, the heartbeat and the stop request."""

    def __init__(self, fs: TrialFS, path: str) -> None:
        self.fs = fs
        self.path = path

    def _box(self, box: str, trial_id: str) -> str:
        return self.fs.join(self.path, box, f"{trial_id}.json")

    def enqueue(self, trial_id: str, payload: dict[str, Any], box: str = QUEUE) -> None:
        """Queue (or hold) a run of the trial, first removing the note of the keeper an earlier run of it
        was started with: until the worker starts this run's keeper, none is noted."""
        self.fs.remove(self._keeper_note(trial_id))
        self.fs.write(self._box(box, trial_id), json.dumps(payload).encode())

    def dequeue(self, trial_id: str) -> None:
        """Take a trial out of the boxes the worker has not taken it from yet."""
        for box in (HOLD, QUEUE):
            self.fs.remove(self._box(box, trial_id))

    def boxes_holding(self, trial_id: str) -> set[str]:
        return {box for box in (HOLD, QUEUE, TAKEN) if self.fs.exists(self._box(box, trial_id))}

    def _keeper_note(self, trial_id: str) -> str:
        return self.fs.join(self.path, TAKEN, f"{trial_id}{KEEPER_NOTE}")

    def started_keeper(self, trial_id: str) -> tuple[int, int] | None:
        """(pid, start time) of the keeper the worker started for a trial it took, once it did (after
        writing the trial's files); None before, or when the note cannot be read."""
        return keeper_identity(read_json(self.fs, self._keeper_note(trial_id)))

    def release(self, trial_id: str, change: Callable[[dict[str, Any]], None]) -> None:
        """Move a held trial to the queue, its payload changed by ``change(payload)`` first."""
        held = self._box(HOLD, trial_id)
        payload = read_json(self.fs, held)
        if payload is None:
            return
        change(payload)
        self.enqueue(trial_id, payload)
        self.fs.remove(held)

    def kill(self, trial_id: str, trial_dir: str) -> None:
        """Ask the worker to stop a trial (for workers the controller cannot run a command next to)."""
        self.fs.remove(self._box(QUEUE, trial_id))
        self.fs.write(self.fs.join(self.path, KILL, trial_id), trial_dir.encode())

    def heartbeat(self) -> None:
        self.fs.touch(self.fs.join(self.path, HEARTBEAT), str(time.time()).encode())

    def stop(self) -> None:
        self.fs.touch(self.fs.join(self.path, STOP))

    def worker_info(self) -> dict[str, Any] | None:
        return read_json(self.fs, self.fs.join(self.path, WORKER_INFO))
