"""trialflow's kept local Prefect server: one Prefect server on 127.0.0.1 per TRIALFLOW_HOME (the app
``prefect server start`` serves: API, services and UI),
started on first use and reused by every experiment after it, with its UI.

Without ``PREFECT_API_URL`` an experiment needs a Prefect API. Prefect's own answer, a temporary server
per process, costs seconds at every start and takes the UI away with the run; this module keeps one
server instead (which API a process uses: :mod:`trialflow.server.api_choice`; a flow run's page in its UI:
:mod:`trialflow.server.prefect_ui_pages`).

Lifecycle: :func:`ensure_server` starts the server when none of this home runs -- in a session of its
own (a Ctrl-C in the caller's terminal never reaches it), its database and log under
``$TRIALFLOW_HOME/prefect-server/`` -- and records it in ``server.json`` (pid, its start time, port); a
file lock makes concurrent callers start one server. It stays until :func:`stop_server` (``trialflow
server stop``), until the process given as ``stop_with`` dies (the test suite's server), or until its
folder is removed (``rm -r`` of the home: nothing could find or stop it afterwards). A recorded
pid counts only with the same start time, so a recycled pid is never taken for the server. Once a
server is seen healthy, the Prefect version its database is migrated to is noted; a later start with
that version skips Prefect's migration check (:mod:`trialflow.server.prefect_db_template`).

The server runs Prefect's app through :mod:`trialflow.server.kept_server_app`, under a keeper
(:mod:`trialflow.server.port_keeper`, the recorded process) that holds its port from the start to
:func:`stop_server` and starts the server again after a crash. Standard library only: the CLI
calls this before anything imports Prefect.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..foundation.user_errors import UserError
from ..trial.procs import (
    group_alive,
    kill_group,
    pid_alive,
    process_start_time,
    read_json,
    stop_with,
    with_this_trialflow,
    write_atomic,
)
from .prefect_db_template import note_migrated, prefect_version, start_settings

SERVER_SETTING = "TRIALFLOW_PREFECT_SERVER"  # "kept" (the default) or "temporary" (Prefect's, one per process)
DEFAULT_PORT = 4200  # Prefect's own default port, when free
HOST = "127.0.0.1"
LISTEN_BACKLOG = 2048  # uvicorn's default
FOLDER = "prefect-server"
AUTH_FILE = "auth"  # the API's auth string, 0600 in the 0700 server folder
STARTUP_SECONDS = 120.0  # a first start may create the database; a busy machine takes longer
DEFAULT_WORKING_DIRECTORY = "~/trialflow-experiments"  # as the config's experimentWorkingDirectory default
# The CA file a client of the kept server gives Prefect (PREFECT_API_SSL_CERT_FILE). The server speaks
# plain HTTP, so no certificate is ever checked, but Prefect's client builds a TLS context for each
# client it makes, reading this file: the whole CA bundle takes ~20 ms a client, this one-root file
# (a public root from certifi's bundle) under 1 ms.
PLAIN_HTTP_TRUST = Path(__file__).with_name("plain_http_trust.pem")
# Prefect settings the kept server starts with unless the environment sets them. Task runs reach the
# server as state events (three task runs per trial, nine events); Prefect's recorder writes them one
# event per transaction by default, the server's largest cost per trial. Written in batches they show
# at most a second late in the UI (benchmarks/README.md: "after batching the kept server's task-run writes").
SERVER_DEFAULTS = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "200",
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_READ_BATCH_SIZE": "50",
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL": "1",
}


class ServerError(UserError, RuntimeError):
    """The kept server could not start, or does not answer; the message says what to do."""


@dataclass(frozen=True)
class KeptServer:
    """A kept server as recorded: its process (session leader), that process's start time and port."""

    pid: int
    start_time: int
    port: int
    home: Path
    prefect: str | None = None  # the Prefect version it runs
    url_prefix: str = ""  # the path its UI is served under ("/team/nni"; "" for the root)

    @property
    def url(self) -> str:
        """Its API URL (what PREFECT_API_URL would be)."""
        return f"http://{HOST}:{self.port}/api"

    @property
    def ui_url(self) -> str:
        """Where its UI is (nnictl's ``--url_prefix`` puts it under a path)."""
        return f"http://{HOST}:{self.port}{self.url_prefix}"

    @property
    def auth(self) -> str | None:
        """The auth string its API asks of clients (Prefect's ``PREFECT_API_AUTH_STRING``). From then on
        this process connects to its port only while this user listens there (:mod:`.port_guard`)."""
        return _recorded_auth(self.home, self.port)

    def client_settings(self) -> dict[str, str]:
        """The environment a client of this server needs: its address and auth string."""
        auth = self.auth
        return {"PREFECT_API_URL": self.url, **({"PREFECT_API_AUTH_STRING": auth} if auth else {})}

    @property
    def log_path(self) -> Path:
        return self.home / "server.log"

    def alive(self) -> bool:
        return pid_alive(self.pid, self.start_time)

    def healthy(self, timeout: float = 2.0) -> bool:
        """True when its API answers its health check."""
        return self._answers("health", timeout)

    def ready(self, timeout: float = 10.0) -> bool:
        """True when its API can read its database (Prefect's readiness check)."""
        return self._answers("ready", timeout)

    def running_flow_runs(self, timeout: float = 5.0) -> int:
        """How many flow runs are Pending or Running on it, asked with its auth string (0 when it does not
        answer)."""
        import json
        import urllib.request

        query = {"flow_runs": {"state": {"type": {"any_": ["PENDING", "RUNNING"]}}}}
        request = urllib.request.Request(f"{self.url}/flow_runs/count", data=json.dumps(query).encode(),
                                         headers={"Content-Type": "application/json", **self._auth_header()})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return int(json.load(response))
        except (OSError, ValueError):
            return 0

    def _auth_header(self) -> dict[str, str]:
        """Prefect's basic auth for this server (none when it has no auth string)."""
        import base64

        auth = self.auth
        return {"Authorization": "Basic " + base64.b64encode(auth.encode()).decode()} if auth else {}

    def _answers(self, probe: str, timeout: float) -> bool:
        """Whether the API's unauthenticated ``probe`` endpoint answers 200."""
        import urllib.request  # here, not at the top: `trialflow --help` imports this module

        try:
            with urllib.request.urlopen(f"{self.url}/{probe}", timeout=timeout) as response:
                return bool(response.status == 200)
        except (OSError, ValueError):
            return False

    @property
    def database(self) -> Path:
        return self.home / "prefect" / "prefect.db"

    def wait_until_healthy(self, timeout: float = STARTUP_SECONDS) -> KeptServer:
        """Returns itself once its API answers and reads its database. Raises :class:`ServerError` when it
        exits first, does not answer within ``timeout`` seconds, or cannot read its database."""
        deadline = time.monotonic() + timeout
        delay = 0.02
        while True:
            if self.healthy():
                if not self.ready():
                    raise ServerError(self.unreadable_database())
                note_migrated(self.home, self.database, self.prefect)  # a later start skips the migration
                return self
            if not self.alive():
                raise ServerError(f"the local Prefect server exited while starting: {self._log_tail()}; "
                                  f"its log: {self.log_path}")
            if time.monotonic() > deadline:
                raise ServerError(f"the local Prefect server (pid {self.pid}) does not answer at {self.url} after "
                                  f"{timeout:.0f} s: `trialflow server stop`, then try again; its log: {self.log_path}")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.1)

    def unreadable_database(self) -> str:
        """The one line for a server whose database cannot be read (damaged, or its disk gone)."""
        return (f"the local Prefect server (pid {self.pid}) cannot read its database {self.database}: it is damaged "
                f"or its disk is full; `trialflow server stop`, move that file away (its runs, logs and blocks are "
                f"lost; a new one is made at the next start), then try again")

    def _log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "no log"
        return " | ".join(lines[-3:]) or "no output"


def server_home(home: Path | None = None) -> Path:
    """Where the kept server of ``home`` (default: TRIALFLOW_HOME) keeps its record, log and database."""
    base = home if home is not None else Path(os.path.expanduser(
        os.environ.get("TRIALFLOW_HOME", DEFAULT_WORKING_DIRECTORY)))
    return base / FOLDER


def _record_path(folder: Path) -> Path:
    return folder / "server.json"


def _read(folder: Path) -> tuple[KeptServer | None, int | None, str]:
    """(the recorded running server or None, the port last used, the UI's path prefix last used)."""
    data = read_json(str(_record_path(folder))) or {}
    port = data.get("port") if isinstance(data.get("port"), int) else None
    prefix = data.get("url_prefix")
    prefix = prefix if isinstance(prefix, str) else ""
    try:
        server = KeptServer(int(data["pid"]), int(data["start_time"]), int(data["port"]), folder,
                            data.get("prefect") if isinstance(data.get("prefect"), str) else None, prefix)
    except (KeyError, TypeError, ValueError):
        return None, port, prefix
    return (server if server.alive() else None), port, prefix


def _stopped_record(server: KeptServer) -> dict[str, object]:
    """What ``server.json`` keeps of a server that no longer runs: what its next start reuses."""
    return {"port": server.port, **({"url_prefix": server.url_prefix} if server.url_prefix else {})}


def ui_path_prefix(value: str) -> str:
    """nnictl's ``--url_prefix`` as the path the UI is served under: ``"nni"``, ``"/nni/"`` ->
    ``"/nni"``; ``""`` or ``"/"`` -> ``""`` (the root). Raises :class:`ServerError` for a prefix that is
    not a plain path or that would hide the API (``/api``)."""
    segments = [s for s in value.strip().split("/") if s]
    for segment in segments:
        if segment in (".", "..") or not all(c.isascii() and (c.isalnum() or c in "-._~") for c in segment):
            raise ServerError(f"--url_prefix {value!r}: use letters, digits and - . _ ~ between slashes, "
                              "e.g. --url_prefix nni")
    if segments[:1] == ["api"]:
        raise ServerError(f"--url_prefix {value!r}: /api is where the server's API is; choose another, "
                          "e.g. --url_prefix nni")
    return "".join(f"/{s}" for s in segments)


def recorded_address(home: Path | None = None) -> tuple[int | None, str]:
    """The port and the UI's path prefix the kept server of ``home`` last used (None, "" before its
    first start)."""
    return _read(server_home(home))[1:]


def running_server(home: Path | None = None) -> KeptServer | None:
    """The kept server of ``home`` when its process runs (healthy or still starting), else None."""
    return _read(server_home(home))[0]


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    _private(folder)
    with open(folder / "server.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _private(folder: Path) -> None:
    """The server's folder, readable by its user only (its database holds the blocks' secrets and
    their key; an older trialflow made it 0755)."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    if folder.stat().st_mode & 0o077:
        folder.chmod(0o700)


def _auth_string(folder: Path) -> str:
    """The API's auth string (``<user>:<random>``, Prefect's basic auth), made once and kept 0600 in
    :data:`AUTH_FILE`; the caller holds the folder's lock."""
    path = folder / AUTH_FILE
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    value = f"trialflow:{secrets.token_urlsafe(24)}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value + "\n")
    return value


def auth_for(api: str | None, home: Path | None = None) -> str | None:
    """The auth string a client sends to ``api`` when that is the kept server of ``home`` (its
    recorded address), else None (another server's credentials are not trialflow's to send)."""
    folder = server_home(home)
    _, port, _ = _read(folder)
    if not api or port is None or api.rstrip("/") != f"http://{HOST}:{port}/api":
        return None
    return _recorded_auth(folder, port)


def _recorded_auth(folder: Path, port: int) -> str | None:
    """The auth string kept in the server folder ``folder``, whose server listens on ``port``; None when
    there is none (a server started by an older trialflow, or none yet). A process that reads it sends
    it to that port only while this user listens there (:func:`.port_guard.guard`)."""
    from .port_guard import guard

    try:
        auth = (folder / AUTH_FILE).read_text().strip() or None
    except OSError:
        return None
    if auth is not None:
        guard(HOST, port)
    return auth


def _bound(port: int) -> socket.socket | None:
    """A TCP socket bound to ``port`` on loopback (0: any free port) and listening (connections wait
    in its backlog until the server accepts them); None when the port is taken. SO_REUSEADDR as
    uvicorn sets it, so a port left in TIME_WAIT by the server's last run counts as free (else a
    restart would move it). It listens at once because Linux lets two sockets with SO_REUSEADDR bind
    one port as long as neither listens: two homes' servers starting at the same moment would both
    take the default port, and one home's clients would reach the other's server."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((HOST, port))
        sock.listen(LISTEN_BACKLOG)
    except OSError:
        sock.close()
        return None
    return sock


def _bind_port(last: int | None, preferred: int, exact: bool = False) -> socket.socket:
    """The server's socket, bound here and handed to its process, so that nothing else can take the
    port between its choice and the server's start: the port used last time, else ``preferred`` (0:
    none), when free (UI addresses printed earlier stay valid); else any free port. ``exact``: the
    user chose ``preferred``; only it will do. Raises :class:`ServerError` when no port can be bound."""
    for port in [preferred] if exact else [p for p in (last, preferred) if p] + [0]:
        sock = _bound(port)
        if sock is not None:
            return sock
    if exact:
        raise ServerError(f"port {preferred} on {HOST} is taken: choose another with --port")
    raise ServerError(f"no free port on {HOST} for the local Prefect server")


def ensure_server(home: Path | None = None, wait: bool = True, stop_with_pid: int | None = None,
                  port: int = DEFAULT_PORT, exact_port: bool = False, url_prefix: str | None = None) -> KeptServer:
    """The kept server of ``home``, started first when none runs; with ``wait`` (the default) only once
    its API answers. ``stop_with_pid``: a server started by this call stops when that process dies.
    ``port``: the port a first start prefers (0: any free one); with ``exact_port``, the one it must
    use (later starts keep it). ``url_prefix`` (nnictl's, as :func:`ui_path_prefix` reads it): the path
    its UI must be served under, kept for later starts too; left out, a start reuses the last one.
    Raises :class:`ServerError` when it cannot start, does not answer, or runs on another port than an
    ``exact_port`` or with another prefix than ``url_prefix``."""
    folder = server_home(home)
    prefix = None if url_prefix is None else ui_path_prefix(url_prefix)
    with _locked(folder):
        server, last_port, last_prefix = _read(folder)
        if server is not None and server.auth is None:
            server = _replace_open_server(server)
        if server is not None and exact_port and server.port != port:
            raise ServerError(f"the local Prefect server already runs on port {server.port}: `trialflow server "
                              f"stop`, then `trialflow server start --port {port}`")
        if server is not None and prefix is not None and server.url_prefix != prefix:
            raise ServerError(f"the local Prefect server already serves its UI at {server.ui_url}: `trialflow "
                              f"server stop`, then `trialflow server start --url_prefix {prefix or '/'}`")
        if server is None:
            auth = _auth_string(folder)
            with _bind_port(last_port, port, exact_port) as sock:
                server = _spawn(folder, sock, auth, last_prefix if prefix is None else prefix)
            if stop_with_pid is not None:
                stop_with(stop_with_pid, server.pid)
    return server.wait_until_healthy() if wait else server


class OpenServerWarning(UserWarning):
    """The kept server runs without API auth (an older trialflow started it) and cannot be replaced yet."""


def _replace_open_server(server: KeptServer) -> KeptServer | None:
    """A running kept server with no auth string recorded was started by an older trialflow: every local
    user can read its blocks' secrets. It is stopped (None: the caller starts a private one, on the same
    port) unless flow runs still run on it; then it is kept for them, with an :class:`OpenServerWarning`.
    The caller holds the folder's lock. Raises :class:`ServerError` when it does not stop."""
    running = server.running_flow_runs()
    if running:
        import warnings

        warnings.warn(f"the local Prefect server (pid {server.pid}) was started by an older trialflow without "
                      f"API auth: every local user can reach it; the first trialflow command after its {running} "
                      "running flow run(s) end replaces it with a private one", OpenServerWarning, stacklevel=3)
        return server
    kill_group(server.pid, 5.0)
    if group_alive(server.pid):
        raise ServerError(f"the local Prefect server (pid {server.pid}), open to every local user, did not stop")
    write_atomic(str(_record_path(server.home)), _stopped_record(server))
    return None


def _spawn(folder: Path, sock: socket.socket, auth: str, url_prefix: str) -> KeptServer:
    """Start the server process on ``sock`` (listening; the caller closes its copy), private
    to this user: every API call but the health check needs ``auth``, browsers may call it from its
    own UI's origin only, and requests must name it by a loopback address (kept_server_app). Its UI is
    served under ``url_prefix`` (a normalized path, "" for the root)."""
    port = int(sock.getsockname()[1])
    prefect_home = folder / "prefect"
    prefect_home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_API_KEY")}
    origins = f"http://{HOST}:{port},http://localhost:{port}"
    env.update(PREFECT_HOME=str(prefect_home), PREFECT_UI_API_URL=f"http://{HOST}:{port}/api",
               PREFECT_SERVER_API_AUTH_STRING=auth, PREFECT_API_AUTH_STRING=auth,
               PREFECT_SERVER_CORS_ALLOWED_ORIGINS=origins,
               PREFECT_UI_SERVE_BASE=url_prefix or "/")
    env = with_this_trialflow(env)
    if url_prefix:
        # Prefect writes the prefix into a copy of the UI's files, by default one copy inside the
        # Prefect package that every server of this installation shares: this server's copy is its own
        env["PREFECT_UI_STATIC_DIRECTORY"] = str(folder / "ui")
    env = {**SERVER_DEFAULTS, **env}
    version = prefect_version()
    env.update(start_settings(folder, prefect_home / "prefect.db", version, env))  # skip or seed the migration
    with open(folder / "server.log", "ab") as log:
        # what `prefect server start` runs (its app, with its services and UI, under uvicorn), without
        # the Prefect CLI's own start-up: less CPU on every start (see kept_server_app)
        level = os.environ.get("PREFECT_SERVER_LOGGING_LEVEL", "WARNING").lower()
        fd = str(sock.fileno())
        # the keeper (the recorded process) holds the socket while the server lives, and runs it again
        # after a crash: the port is never free for another program while clients still call it
        # the keeper also stops the server once this folder is removed: nothing could find it then
        command = [sys.executable, "-S", "-m", "trialflow.server.port_keeper", "--fd", fd,  # -S: stdlib only
                   "--folder", str(folder), "--",
                   sys.executable, "-m", "trialflow.server.kept_server_app", "--fd", fd, "--log-level", level]
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, close_fds=True, pass_fds=(sock.fileno(),))
    start_time = process_start_time(proc.pid)
    if start_time is None:  # exited at once: its log says why
        proc.wait()
        raise ServerError(f"the local Prefect server exited at once (code {proc.returncode}); its log: "
                          f"{folder / 'server.log'}")
    write_atomic(str(_record_path(folder)), {"pid": proc.pid, "start_time": start_time, "port": port,
                                             "prefect": version, "url_prefix": url_prefix})
    return KeptServer(proc.pid, start_time, port, folder, version, url_prefix)


def stop_server(home: Path | None = None, grace: float = 10.0) -> KeptServer | None:
    """Stop the kept server of ``home`` (its whole session); returns it, or None when none ran. The port
    stays recorded, so the next start reuses it. A spare controller waiting for its next command ends
    first. Raises :class:`ServerError` when it does not stop."""
    from .spare_record import stop_spare

    folder = server_home(home)
    stop_spare(folder)
    with _locked(folder):
        server = _read(folder)[0]
        if server is None:
            return None
        kill_group(server.pid, grace / 2)
        if group_alive(server.pid):
            raise ServerError(f"the local Prefect server (pid {server.pid}) did not stop")
        write_atomic(str(_record_path(folder)), _stopped_record(server))
    return server


def revive(api: str, home: Path | None = None) -> None:
    """Start the kept server again when ``api`` is its address and it was stopped (a later ``trialflow
    stop`` still reaches the records of a run made against it). Raises :class:`ServerError`."""
    server, port, _ = _read(server_home(home))
    if server is None and port is not None and api == f"http://{HOST}:{port}/api":
        ensure_server(home)
