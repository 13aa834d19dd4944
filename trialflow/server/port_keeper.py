"""The kept server's keeper: holds the server's listening socket for as long as the server is meant to
run, and starts the server again on it when the server dies unasked.

Why: a server that crashes or is killed (the kernel's OOM killer sends SIGKILL) frees its port, while
running controllers, a work pool and a browser tab on the UI go on calling it. Any local user who
binds the port meanwhile would answer them: tell a controller its flow run is Cancelling, or serve the
tab a page of its own under the UI's origin. With the socket held here the port is never free, and
the calls made meanwhile wait in the socket's backlog until the new server serves them.

Lifecycle: ``python -m trialflow.server.port_keeper --fd N [--folder DIR] -- COMMAND...`` (what
:mod:`trialflow.server.kept_server` starts, as the leader of a session of its own: the process it
records). The keeper keeps its copy of socket N open and runs COMMAND, which inherits N, with
``--ready-fd R`` appended: a pipe the server writes to once it serves. Then:

- the server ends before it wrote to R (it could not start): the keeper ends with its exit code;
- it ends with code 0 or by SIGINT or SIGTERM (stopped by someone): the keeper ends, code 0;
- it dies otherwise after it served (SIGKILL, a crash, an error): one line on stderr (the server's
  log) and the same command runs again, at most :data:`MAX_RESTARTS` times in :data:`RESTART_WINDOW`
  seconds (then the keeper ends, code 1, saying so);
- the keeper gets SIGINT, SIGTERM or SIGHUP (``trialflow server stop`` signals the whole session):
  the server is sent SIGTERM (a graceful stop, also when it got the signal itself) and the keeper
  ends once it has, code 0;
- ``--folder DIR`` (the server's folder, its record, database and log) is removed, or another folder
  takes its path: the keeper sees it within :data:`FOLDER_CHECK_SECONDS`, says so in one line and
  stops the server as above (SIGKILL after :data:`STOP_GRACE_SECONDS` if it has not ended then).
  Nothing could find such a server any more (``server stop`` reads its record there), and it would
  hold its port for good. Where the kernel cannot watch the server's process by descriptor
  (``pidfd_open``), the folder is not looked at.

The server is sent SIGTERM when the keeper dies (``PR_SET_PDEATHSIG``), so neither outlives the
other for long. Standard library only (and the standard-library-only :mod:`trialflow.foundation.readable`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from ..foundation.readable import wait_readable

MAX_RESTARTS = 5
RESTART_WINDOW = 600.0  # seconds
READY = b"ready"  # what the server writes to its --ready-fd once it serves
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
STOPPED_CODES = (0, -signal.SIGINT, -signal.SIGTERM)  # Popen.returncode of a server stopped as asked
PR_SET_PDEATHSIG = 1
FOLDER_CHECK_SECONDS = 5.0  # between the keeper's looks at whether the server's folder is still there
STOP_GRACE_SECONDS = 10.0  # a server stopped for its removed folder is killed when it has not ended by then


def _follow_keeper(keeper: int) -> None:
    """In the server's process, before it runs: SIGTERM when the keeper dies; an end at once if it
    already has."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != keeper:
        os._exit(1)


def _cause(code: int) -> str:
    return f"by {signal.Signals(-code).name}" if code < 0 else f"with code {code}"


def _say(line: str) -> None:
    print(f"trialflow port keeper (pid {os.getpid()}): {line}", file=sys.stderr, flush=True)


class Keeper:
    """One socket kept and one server command run on it, again after each unasked death."""

    def __init__(self, fd: int, command: list[str], folder: str | None = None) -> None:
        """``folder``: the server stops once it is removed (None: never looked at). Raises OSError when
        ``folder`` is given and cannot be read."""
        self.fd = fd
        self.command = command
        self.stopping = False
        self.server: subprocess.Popen[bytes] | None = None
        self.restarts: list[float] = []
        self.folder = folder
        self.folder_id = _identity(os.stat(folder)) if folder is not None else None

    def folder_removed(self) -> bool:
        """Whether the folder given at the start is gone from its path (removed, or replaced by another).
        An error other than its absence (a network file system's hiccup) counts as still there."""
        if self.folder is None:
            return False
        try:
            return _identity(os.stat(self.folder)) != self.folder_id
        except FileNotFoundError:
            return True
        except OSError:
            return False

    def wait_for_server(self, server: subprocess.Popen[bytes]) -> int:
        """Wait until ``server`` ends and return its Popen return code; with a folder, look at it every
        :data:`FOLDER_CHECK_SECONDS` meanwhile and stop the server once it is removed (SIGTERM, then
        SIGKILL after :data:`STOP_GRACE_SECONDS`)."""
        if self.folder is None:
            return server.wait()
        try:
            pidfd = os.pidfd_open(server.pid)  # readable once the server has ended
        except OSError:  # a kernel (or sandbox) without pidfd_open: no folder watch
            return server.wait()
        try:
            kill_at = None  # once the folder is gone: when a server that has not ended is killed
            while not wait_readable([pidfd], FOLDER_CHECK_SECONDS):  # the pid is still the server's (not reaped)
                if kill_at is None and not self.stopping and self.folder_removed():
                    _say(f"the server's folder {self.folder} was removed: stopping the server")
                    self.stopping = True
                    kill_at = time.monotonic() + STOP_GRACE_SECONDS
                    os.kill(server.pid, signal.SIGTERM)
                elif kill_at is not None and time.monotonic() >= kill_at:
                    os.kill(server.pid, signal.SIGKILL)  # no `server stop` can find it to do so
        finally:
            os.close(pidfd)
        return server.wait()

    def stop(self, signum: int, _frame: object) -> None:
        """Signal handler: no more starts; the server, if any, is asked to stop."""
        self.stopping = True
        if self.server is not None and self.server.returncode is None:
            os.kill(self.server.pid, signal.SIGTERM)  # not reaped yet: the pid is still the server's

    def run_once(self) -> tuple[int, int, bool]:
        """Run the server until it ends: (its pid, its Popen return code, whether it said it serves)."""
        ready_read, ready_write = os.pipe()
        try:
            keeper = os.getpid()
            self.server = subprocess.Popen([*self.command, "--ready-fd", str(ready_write)],
                                           pass_fds=(self.fd, ready_write), stdin=subprocess.DEVNULL,
                                           preexec_fn=lambda: _follow_keeper(keeper))
            os.close(ready_write)
            ready_write = -1
            if self.stopping:  # a stop signal came while it was starting
                os.kill(self.server.pid, signal.SIGTERM)
            code = self.wait_for_server(self.server)
            os.set_blocking(ready_read, False)
            try:
                served = os.read(ready_read, len(READY)) == READY
            except BlockingIOError:
                served = False
            return self.server.pid, code, served
        finally:
            os.close(ready_read)
            if ready_write >= 0:
                os.close(ready_write)

    def run(self) -> int:
        """Start the server and keep it running until it is stopped; the keeper's exit code."""
        while True:
            started = time.monotonic()
            pid, code, served = self.run_once()
            if self.stopping or code in STOPPED_CODES:
                return 0
            if not served:
                _say(f"the server (pid {pid}) ended {_cause(code)} "
                     "before it served: not started again")
                return code if code > 0 else 1
            now = time.monotonic()
            self.restarts = [t for t in self.restarts if now - t < RESTART_WINDOW] + [now]
            if len(self.restarts) > MAX_RESTARTS:
                _say(f"the server ended {_cause(code)}, its {MAX_RESTARTS + 1}th end in "
                     f"{RESTART_WINDOW:.0f} s: not started again; its port is free now")
                return 1
            _say(f"the server (pid {pid}) ended {_cause(code)} after "
                 f"{now - started:.0f} s; starting it again on the same socket")


def _identity(status: os.stat_result) -> tuple[int, int]:
    return status.st_dev, status.st_ino


def main(argv: list[str] | None = None) -> int:
    """``--fd N [--folder DIR] -- COMMAND...``: keep socket N and run COMMAND on it, until DIR is
    removed (see the module's text)."""
    args = sys.argv[1:] if argv is None else argv
    folder = None
    if len(args) > 3 and args[2] == "--folder":
        folder, args = args[3], args[:2] + args[4:]
    if len(args) < 4 or args[0] != "--fd" or args[2] != "--" or not args[1].isdigit():
        print("usage: python -m trialflow.server.port_keeper --fd N [--folder DIR] -- COMMAND...", file=sys.stderr)
        return 2
    os.fstat(int(args[1]))  # OSError (EBADF) at once when the socket was not passed
    keeper = Keeper(int(args[1]), args[3:], folder)
    for signum in STOP_SIGNALS:
        signal.signal(signum, keeper.stop)
    return keeper.run()


if __name__ == "__main__":
    sys.exit(main())
