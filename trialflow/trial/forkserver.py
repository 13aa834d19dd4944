"""Keeper fork server: starts local trials' keepers by forking one warm process instead of
starting a Python interpreter per trial (the interpreter's start is most of a short trial's CPU).

Both ends of one pipe protocol live here. :class:`ForkServer` (the controller's end) starts
``python -S -m trialflow.trial.forkserver`` in its own session (at :meth:`ForkServer.start`, else on
first use), writes one trial directory per line to its stdin and reads one reply line per request:

* ``<pid>``: a keeper was forked for the trial; it leads its own session (pid = the trial's
  process group), runs :func:`keeper.run` exactly as ``python -m trialflow.trial.keeper <trial
  dir>`` would, and its ``keeper.pid`` is written before the reply;
* ``claimed``: the trial's keeper was started before (``keeper.lock`` exists), so a retried or
  repeated request never runs a trial twice;
* ``error <message>``: nothing was started.

The server exits when its stdin closes (:meth:`ForkServer.close`, or the controller died);
keepers are not its to stop and carry on, so trials outlive both. The kernel reaps finished
keepers (SIGCHLD ignored), so none lingers as a zombie. Standard library only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import traceback

from .keeper import claim, process_record, run
from .procs import daemonize, write_atomic
from .protocol import KEEPER_PID, META_DIR


def spawn(trial_dir: str) -> str:
    """Fork a keeper for ``trial_dir`` unless one was started before; returns the reply line."""
    meta_dir = os.path.join(trial_dir, META_DIR)
    if not claim(trial_dir):
        return "claimed"
    pid = daemonize(os.path.join(meta_dir, "keeper.log"))
    if pid == 0:  # the keeper
        code = 1
        try:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the keeper waits for its trial
            code = run(trial_dir)
        except BaseException:  # noqa: BLE001 -- report, then leave without returning into the server loop
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    write_atomic(os.path.join(meta_dir, KEEPER_PID), process_record(pid))
    return str(pid)


def serve() -> int:
    """Answer requests on stdin until it closes."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    requests, replies = sys.stdin.buffer, sys.stdout.buffer
    while line := requests.readline():
        trial_dir = os.fsdecode(line.rstrip(b"\n"))
        try:
            reply = spawn(trial_dir)
        except OSError as exc:
            reply = f"error {exc}".replace("\n", " ")
        replies.write(reply.encode() + b"\n")
        replies.flush()
    return 0


class ForkServer:
    """The controller's end: one server per local training service, started on first use and
    restarted once if it died. Thread-safe (one request at a time)."""

    def __init__(self, env: dict[str, str], log_path: str) -> None:
        self._env = env
        self._log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def start_keeper(self, trial_dir: str) -> int | None:
        """Fork the trial's keeper; its pid, or None when it was started before."""
        with self._lock:
            reply = self._request(trial_dir) or self._request(trial_dir, restart=True)
        if not reply:
            raise OSError(f"the keeper fork server stopped answering (see {self._log_path})")
        if reply == "claimed":
            return None
        if reply.startswith("error "):
            raise OSError(reply[len("error "):])
        return int(reply)

    def start(self) -> None:
        """Start the server now, before the first trial (its interpreter starts meanwhile). Raises
        OSError when it cannot start."""
        with self._lock:
            self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        if self._proc is None:
            with open(self._log_path, "ab") as log:
                self._proc = subprocess.Popen(
                    [sys.executable, "-S", "-m", "trialflow.trial.forkserver"], env=self._env,
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, start_new_session=True)
        return self._proc

    def _request(self, trial_dir: str, restart: bool = False) -> str:
        if restart:
            self._stop()
        proc = self._start()
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(os.fsencode(trial_dir) + b"\n")
            proc.stdin.flush()
            return proc.stdout.readline().decode("utf-8", "replace").strip()
        except OSError:
            return ""

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        for stream in (proc.stdin, proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def close(self) -> None:
        with self._lock:
            self._stop()


if __name__ == "__main__":
    sys.exit(serve())
