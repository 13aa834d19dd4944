"""A real ``prefect server start`` on 127.0.0.1 for tests (throwaway home and database). It stops with
the test session; the server and the processes spawned against it (workers, CLI calls) are stopped
by a watchdog when the process that started them dies, however it dies (a killed test run leaves
none behind). Its new database starts as a copy of this user's migrated empty one where there is one
(:mod:`trialflow.server.prefect_db_template`, as the kept server's does): Prefect's migrations are most
of a new server's start-up CPU, and what it serves is the same."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from ..server.kept_server import SERVER_DEFAULTS
from ..server.prefect_db_template import note_migrated, prefect_version, start_settings
from .owned import popen_owned
from .ports import answers_health, on_a_free_port, wait_serving

STARTUP_SECONDS = 120.0


class PrefectServer:
    """``prefect server start`` bound to loopback; after :meth:`start`, :attr:`port` and :attr:`url` say
    where, and :attr:`env` points clients (CLI, workers) at it."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.port = 0
        # the kept server's settings (task runs written in batches, ...): what experiments meet by default
        self.env = {**SERVER_DEFAULTS, **os.environ, "PREFECT_HOME": str(home),
                    "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_SERVER_LOGGING_LEVEL": "WARNING",
                    "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "5", "PREFECT_WORKER_QUERY_SECONDS": "1",
                    "PREFECT_RUNNER_POLL_FREQUENCY": "1",
                    # a worker learns of a cancel over the events websocket; when that is down (a busy
                    # machine), by polling -- every 120 s by default
                    "PREFECT_WORKER_CANCELLATION_POLL_SECONDS": "2",
                    # what its processes make there (a runner's storage, a worker's folder per flow run,
                    # left when a run is cut off) stays in this home, not in the machine's
                    "TMPDIR": str(home / "tmp")}
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def start(self) -> PrefectServer:
        """Start it on a free loopback port (another one when that port is taken meanwhile) and wait
        until it answers; raises RuntimeError when it exits or does not answer in time."""
        (self.home / "tmp").mkdir(parents=True, exist_ok=True)
        return on_a_free_port(self._start_on)

    def _start_on(self, port: int) -> PrefectServer:
        self.port = port
        self.env["PREFECT_API_URL"] = self.url
        env = {k: v for k, v in self.env.items() if k != "PREFECT_API_URL"}
        database, version = self.home / "prefect.db", prefect_version()  # Prefect's default database
        env.update(start_settings(self.home, database, version, env))
        self.proc = _watched([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                              "--port", str(port), "--no-ui"], env, self.home / "server.log")
        try:
            wait_serving(lambda: answers_health(f"{self.url}/health"), self.proc, self.home / "server.log",
                         "prefect server", STARTUP_SECONDS)
        except RuntimeError:
            self.stop()
            raise
        note_migrated(self.home, database, version)  # the template of the next ones, where there is none yet
        return self

    def spawn(self, args: list[str], log: Path, **env: str) -> subprocess.Popen[bytes]:
        """A process (a worker, a CLI call) talking to this server, in its own session."""
        return _watched(args, {**self.env, **env}, log)

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc)
            self.proc = None


def _watched(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """``args`` in a session of its own, output to ``log``, stopped when this process dies."""
    with open(log, "wb") as out:
        return popen_owned(args, env=env, stdout=out, stderr=subprocess.STDOUT)


def stop_group(proc: subprocess.Popen[bytes], grace: float = 15.0) -> None:
    """SIGTERM the process's session (twice: a Prefect worker ignores the first), then SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGTERM):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace / 2)
            return
        except subprocess.TimeoutExpired:
            continue
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
