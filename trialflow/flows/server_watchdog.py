"""A controller's temporary Prefect server ends with the controller, however the controller ends.

Without ``PREFECT_API_URL`` Prefect starts a temporary API server as a child process and stops it at
exit; a controller killed with SIGKILL never gets there, and the server (~200 MB) stays. So each
temporary server this process started gets a watchdog: a small process in a session of its own
(a Ctrl-C in the terminal never reaches it) that waits for the controller's death and then stops
the server -- the same server, checked by its start time, never a process that took its pid later.
Lifecycle: :func:`guard_temporary_servers` is called once the flow runs (the server is up by then);
it is idempotent, and a watchdog ends by itself once its server is gone.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

log = logging.getLogger("trialflow.experiment")
_GUARDED: set[int] = set()

_WATCHDOG = r"""
import os, select, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
parent, server, started = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]

def start_time(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except OSError:
        return None

try:
    select.select([os.pidfd_open(parent)], [], [])
except (AttributeError, OSError):
    while start_time(parent) is not None:
        time.sleep(0.5)
for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0.0)):
    if start_time(server) != started:
        break
    os.kill(server, sig)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and start_time(server) == started:
        time.sleep(0.1)
"""


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except OSError:
        return None


def guard_temporary_servers() -> None:
    """Give each temporary Prefect server of this process that runs a watchdog (once)."""
    try:
        from prefect.server.api.server import SubprocessASGIServer
    except ImportError:  # no server code: nothing of ours to guard
        return
    for server in list(SubprocessASGIServer._instances.values()):
        process = getattr(server, "server_process", None)
        if process is None or process.pid in _GUARDED or process.poll() is not None:
            continue
        started = _start_time(process.pid)
        if started is None:
            continue
        try:
            subprocess.Popen([sys.executable, "-S", "-c", _WATCHDOG, str(os.getpid()), str(process.pid), started],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True, close_fds=True)
        except OSError as exc:  # the experiment runs on; only a SIGKILL would leave the server behind
            log.warning("could not watch the temporary Prefect server (pid %s): %s", process.pid, exc)
            continue
        _GUARDED.add(process.pid)
