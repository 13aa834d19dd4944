"""A throwaway PostgreSQL server on 127.0.0.1 for tests (Debian's ``postgresql`` binaries): a new
cluster in a temporary directory, trust authentication for one user, stopped and removed at the end.
Run as root, the server runs as the ``postgres`` user (PostgreSQL refuses root)."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from .owned import popen_owned
from .ports import on_a_free_port, wait_serving

USER = "trialflow"


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server binaries here (``apt-get install postgresql``)."""


def _bin_dir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        raise PostgresUnavailable("PostgreSQL's initdb was not found under /usr/lib/postgresql: "
                                  "apt-get install postgresql")
    return Path(found[-1]).parent


class LocalPostgres:
    """``with LocalPostgres() as pg: pg.url`` -- a SQLAlchemy URL (psycopg) of an empty database."""

    def __init__(self) -> None:
        self.bin = _bin_dir()
        self.port = 0  # chosen by start()
        self.directory = Path(tempfile.mkdtemp(prefix="trialflow-pg-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self._as: list[str] = []
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            os.chown(self.directory, owner.pw_uid, owner.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://{USER}@127.0.0.1:{self.port}/postgres"

    def start(self, timeout: float = 60.0) -> LocalPostgres:
        """Make the database and serve it on a free loopback port (another one when that port is taken
        meanwhile); raises RuntimeError, having removed it all, when the server exits or does not answer."""
        subprocess.run([*self._as, str(self.bin / "initdb"), "-D", str(self.directory / "data"), "-U", USER, "-A",
                        "trust", "-E", "UTF8", "--no-sync"], check=True, capture_output=True, timeout=120)
        try:
            return on_a_free_port(lambda port: self._serve_on(port, timeout))
        except RuntimeError:
            self.stop()
            raise

    def _serve_on(self, port: int, timeout: float) -> LocalPostgres:
        self.port = port
        with open(self.directory / "server.log", "wb") as log:
            self.proc = popen_owned(
                [*self._as, str(self.bin / "postgres"), "-D", str(self.directory / "data"), "-h", "127.0.0.1",
                 "-p", str(port), "-k", str(self.directory), "-c", "fsync=off", "-c", "max_connections=200"],
                stdout=subprocess.DEVNULL, stderr=log)
        wait_serving(lambda: subprocess.run([str(self.bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(port)],
                                            capture_output=True).returncode == 0,
                     self.proc, self.directory / "server.log", "postgres", timeout)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)  # fast shutdown
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> LocalPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
