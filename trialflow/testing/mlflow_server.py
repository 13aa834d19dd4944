"""A throwaway MLflow tracking server on 127.0.0.1 for tests: ``mlflow server`` from PyPI with its
SQLite backend, a local artifact store and (unless ``auth=False``) MLflow's basic-auth app (one admin
user, accepted credentials cached), without MLflow's job runner, in a temporary directory.
:meth:`LocalMlflow.stop` and :meth:`LocalMlflow.start` again keep its port and data (a tracker that
goes away and comes back); it stops with the process that started it, also when that process is killed,
and :meth:`LocalMlflow.close` removes its directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ..trial.procs import stop_with
from .ports import answers_health, log_size, on_a_free_port, wait_serving
from .prefect_server import stop_group

ADMIN = "admin"
# MLflow checks the password (scrypt) on every request unless it caches credentials it accepted
# (auth_cache_ttl_seconds, off by default): several checks a request, ~10 s under the suite's load
AUTH_CACHE_SECONDS = 600


class LocalMlflow:
    def __init__(self, auth: bool = True) -> None:
        self.auth = auth
        self.port = 0  # chosen by the first start()
        self.directory = Path(tempfile.mkdtemp(prefix="trialflow-mlflow-"))
        self.password = "tf-" + os.urandom(9).hex()
        self.proc: subprocess.Popen[bytes] | None = None
        (self.directory / "auth.ini").write_text(
            f"[mlflow]\ndefault_permission = READ\ndatabase_uri = sqlite:///{self.directory / 'auth.db'}\n"
            f"admin_username = {ADMIN}\nauth_cache_ttl_seconds = {AUTH_CACHE_SECONDS}\n"
            "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n")

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def login(self) -> dict[str, str]:
        """The MLflow client's environment for the admin user."""
        return {"MLFLOW_TRACKING_USERNAME": ADMIN, "MLFLOW_TRACKING_PASSWORD": self.password}

    def start(self, timeout: float = 180.0) -> LocalMlflow:
        """Start it (again, on the same port) and wait until it answers; the first start takes a free
        loopback port (another one when that is taken meanwhile). Raises RuntimeError when it does not
        answer."""
        if self.port:
            return self._start_on(self.port, timeout)
        return on_a_free_port(lambda port: self._start_on(port, timeout))

    def _start_on(self, port: int, timeout: float) -> LocalMlflow:
        self.port = port
        env = {**os.environ, "MLFLOW_AUTH_CONFIG_PATH": str(self.directory / "auth.ini"),
               "MLFLOW_AUTH_ADMIN_PASSWORD": self.password, "MLFLOW_FLASK_SERVER_SECRET_KEY": os.urandom(16).hex(),
               # its job runner (GenAI scoring, trace archival) starts ~8 interpreters that import MLflow
               # for a minute after each start; tracking does not use it
               "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        log_path = self.directory / "server.log"  # appended to: a restart keeps the earlier launches' lines
        launch_begins = log_size(log_path)
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                 "--backend-store-uri", f"sqlite:///{self.directory / 'mlflow.db'}", "--artifacts-destination",
                 str(self.directory / "artifacts"), "--workers", "1",
                 *(["--app-name", "basic-auth"] if self.auth else [])],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.directory,
                start_new_session=True)
        stop_with(os.getpid(), self.proc.pid)
        try:
            wait_serving(lambda: answers_health(f"{self.uri}/health"), self.proc, log_path, "mlflow server",
                         timeout, log_from=launch_begins)
        except RuntimeError:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop it; its data stays for :meth:`start`."""
        if self.proc is not None:
            stop_group(self.proc)
        self.proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)
