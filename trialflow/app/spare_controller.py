"""A spare controller: a background controller started ahead of the next ``trialflow create`` or
``resume`` against the kept Prefect server, its imports done, waiting to be claimed.

Lifecycle: once a background command has handed its experiment to a controller, it starts a spare
(:func:`start_spare`): :func:`main` in a new ``python -P``, this trialflow first on its module path, in a session of
its own, with the environment that controller got. The spare takes the spare lock of the kept server's folder
(another spare holds it: it ends at once), imports what a run needs (after a short delay), then listens on a Unix
socket in a new 0700 folder of the temporary directory, recorded in ``spare.json`` of the kept server's 0700 folder.
The next background command claims it (:func:`claim_spare`): when the claimant is this user with the same Python,
trialflow and library files, environment, groups, CPUs and resource limits, the spare gives up its lock, record and
socket, answers ``taken``, and becomes that command's :class:`~trialflow.app.controller_launch.PendingController`: it
runs the job sent on the connection in the claimant's working directory and umask; when the connection closes
without one (the config was refused) it takes its lock, record and a new socket again and waits on. A claim that
differs makes it answer ``other`` and end (the command starts a controller of its own, then a spare for its
settings). Unclaimed, it ends after :data:`IDLE_SECONDS`, when the kept server stops, or at ``trialflow server
stop``; its socket folder, record and output go with it.

Standard library only until claimed.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from ..foundation.process_fingerprint import fingerprint, umask
from ..server.kept_server import KeptServer, running_server
from ..server.spare_record import RECORD
from ..trial.procs import process_start_time, read_json, write_atomic
from .controller_launch import PendingController, start_controller

SPARE_SETTING = "TRIALFLOW_SPARE_CONTROLLER"  # "0" (or off/false/no): no spares
LOCK = "spare.lock"  # held by the one spare of a kept server (loading or ready)
IDLE_SECONDS = 3600.0  # an unclaimed spare ends after this long
# a new spare waits this long before its imports, which would take CPU from the start of the experiment
# just handed over (a lower priority would not help: the kernel shares CPU between sessions first, and
# threads that the imports start would keep it)
START_DELAY_SECONDS = 2.0
CLAIM_SECONDS = 2.0  # how long either side waits for the other's line of a claim
MAX_CLAIM_BYTES = 1 << 20  # a claim's line (mostly its environment); a longer one is refused
# differ between one shell's commands (pyenv's shims set PYENV_DIR to the working directory): taken from
# the claimant
VOLATILE = frozenset({"PWD", "OLDPWD", "_", "PYENV_DIR"})
# modules a run imports lazily on its way to the first trial: the spare imports them while it waits (a
# name a library version lacks is skipped)
# besides what a run imports first (flows.run_api's lists): what its flow and tasks import as they begin
SPARE_IMPORTS = ("prefect.engine", "fastapi.applications", "graphviz", "sqlalchemy.dialects.sqlite")
_CRED = struct.Struct("3i")  # SO_PEERCRED: pid, uid, gid


def enabled(env: Mapping[str, str] = os.environ) -> bool:
    """Whether spares are on (``TRIALFLOW_SPARE_CONTROLLER`` unset or not 0/off/false/no)."""
    return env.get(SPARE_SETTING, "1").strip().lower() not in ("0", "off", "false", "no")


def _kept_server() -> KeptServer | None:
    """The running kept server when this process reports to it (PREFECT_API_URL is its address)."""
    server = running_server()
    return server if server is not None and os.environ.get("PREFECT_API_URL") == server.url else None


def _claim() -> dict[str, Any]:
    return {"fingerprint": fingerprint(), "env": dict(os.environ), "cwd": os.getcwd(), "umask": umask()}


def _own_private_folder(path: str) -> bool:
    """Whether ``path`` is a real folder of this user that no one else may enter."""
    try:
        stat = os.lstat(path)
    except OSError:
        return False
    return stat.st_uid == os.getuid() and (stat.st_mode & 0o170777) == 0o040700


def _peer(conn: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a Unix socket."""
    pid, uid, _ = _CRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
    return pid, uid


def _read_line(conn: socket.socket, limit: int) -> bytes | None:
    """One line from ``conn`` (without its newline); None at EOF or past ``limit`` bytes. Raises OSError
    (a timeout among them)."""
    data = bytearray()
    while b"\n" not in data:
        chunk = conn.recv(65536)
        if not chunk or len(data) + len(chunk) > limit:
            return None
        data += chunk
    return bytes(data[:data.index(b"\n")])


def claim_spare() -> PendingController | None:
    """The kept server's ready spare, now this command's controller, when spares are on, this process
    reports to the kept server and the spare is this user's with this command's settings (see the
    module doc); else None (the spare, if any, ends when the settings differ). Never raises."""
    if not enabled():
        return None
    server = _kept_server()
    record = read_json(str(server.home / RECORD)) if server is not None else None
    try:
        pid, start_time, path = int(record["pid"]), int(record["start_time"]), record["socket"]  # type: ignore[index]
        spool = Path(str(record["spool"]))  # type: ignore[index]
    except (KeyError, TypeError, ValueError):
        return None
    if not isinstance(path, str):  # still loading
        return None
    if not _own_private_folder(os.path.dirname(path)):
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(CLAIM_SECONDS)
        conn.connect(path)
        recorded = _peer(conn) == (pid, os.getuid()) and process_start_time(pid) == start_time
        if recorded:
            conn.sendall(json.dumps(_claim()).encode() + b"\n")
        if not recorded or _read_line(conn, 64) != b"taken":
            conn.close()
            return None
        conn.settimeout(None)
        channel: IO[bytes] = conn.makefile("wb")
    except OSError:
        conn.close()
        return None
    conn.close()  # the channel holds the connection until it closes
    return PendingController(pid, spool, channel, start_time=start_time)


def start_spare(env: Mapping[str, str]) -> None:
    """Start a spare with ``env`` (the environment the command's controller got) for the command after
    this one, when spares are on, this process reports to the kept server and no spare of it is loading
    or ready. Never raises: a spare that cannot start leaves the next command to start its own."""
    if not enabled(env):
        return
    server = _kept_server()
    if server is None or _lock_held(server.home):
        return
    try:
        fd, spool = tempfile.mkstemp(prefix="spare-", suffix=".out", dir=server.home)
    except OSError:
        return
    try:
        # this trialflow (not whichever the module path finds first), and no working directory on its module
        # path (-P; before Python 3.11, "/"): the claimant's goes there
        safe_path = ["-P"] if sys.version_info >= (3, 11) else []
        code = (f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r}); "
                "from trialflow.app.spare_controller import main; sys.exit(main())")
        subprocess.Popen([sys.executable, *safe_path, "-c", code], stdin=subprocess.DEVNULL, stdout=fd, stderr=fd,
                         env=dict(env), cwd="/", start_new_session=True, close_fds=True)
    except OSError:
        os.unlink(spool)
    finally:
        os.close(fd)


def _lock_held(folder: Path) -> bool:
    try:
        with open(folder / LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False


class _Listing:
    """The spare's lock, record and socket: taken in that order, given up (once) when it is claimed
    or ends. The record names the socket once the spare is ready."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._lock: IO[str] | None = open(folder / LOCK, "a")  # noqa: SIM115 -- held for the spare's life
        self._socket_dir: str | None = None
        self._recorded = False
        self.listener: socket.socket | None = None

    def take_lock(self) -> bool:
        assert self._lock is not None
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def record(self, spool: Path, socket_path: str | None = None) -> None:
        """Record this spare: loading (no socket yet; ``trialflow server stop`` can end it) or ready."""
        self._recorded = True
        write_atomic(str(self.folder / RECORD), {"pid": os.getpid(), "start_time": process_start_time(os.getpid()),
                                                 "socket": socket_path, "spool": str(spool)})

    def open(self, spool: Path) -> socket.socket:
        """Listen, then record the socket for claimants."""
        self._socket_dir = tempfile.mkdtemp(prefix="trialflow-spare-")
        path = os.path.join(self._socket_dir, "controller.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        os.chmod(path, 0o600)  # in a 0700 folder: this user only, twice over
        self.listener.listen(8)
        self.listener.settimeout(1.0)
        self.record(spool, path)
        return self.listener

    def give_up(self) -> None:
        """Record, socket and lock gone (idempotent): another spare may take their place."""
        if self._recorded:
            record = read_json(str(self.folder / RECORD)) or {}
            if record.get("pid") == os.getpid():
                with contextlib.suppress(OSError):
                    os.unlink(self.folder / RECORD)
            self._recorded = False
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        if self._lock is not None:
            self._lock.close()  # its flock with it
            self._lock = None


def _load() -> None:
    """Import what a run needs."""
    from ..foundation.startup_gc import collector_paused, set_aside

    with collector_paused():
        from ..flows import experiment  # noqa: F401
        from ..flows.run_api import FIRST_RUN_IMPORTS, WHILE_STARTING_IMPORTS

        for name in (*SPARE_IMPORTS, *FIRST_RUN_IMPORTS, *WHILE_STARTING_IMPORTS):
            with contextlib.suppress(ImportError):
                importlib.import_module(name)
    set_aside(collect_first=True)  # the run never walks the imports' objects


def _judge(conn: socket.socket) -> dict[str, Any] | None:
    """The claim on ``conn``: None when it is not from this user or not a well-formed claim."""
    conn.settimeout(CLAIM_SECONDS)
    try:
        if _peer(conn)[1] != os.getuid():
            return None
        line = _read_line(conn, MAX_CLAIM_BYTES)
        claim = json.loads(line) if line is not None else None
    except (OSError, ValueError):
        return None
    if not isinstance(claim, dict) or not isinstance(claim.get("fingerprint"), str) \
            or not isinstance(claim.get("env"), dict) or not isinstance(claim.get("cwd"), str) \
            or not isinstance(claim.get("umask"), int) \
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in claim["env"].items()):
        return None
    return claim


def _settled(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in VOLATILE}


def _await_claim(listing: _Listing, server: KeptServer, mine: str,
                 env: dict[str, str]) -> tuple[socket.socket, dict[str, Any]] | None:
    """The connection and claim of the command this spare now serves (its fingerprint must be ``mine``,
    its environment ``env`` but for the volatile variables), its listing given up; None when it should
    end unclaimed (idle too long, the kept server gone, a claim with other settings)."""
    listener = listing.listener
    assert listener is not None
    deadline = time.monotonic() + IDLE_SECONDS
    while time.monotonic() < deadline and server.alive():
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        claim = _judge(conn)
        if claim is None:  # not a claim of this user: the spare waits on
            conn.close()
            continue
        if claim["fingerprint"] != mine or _settled(claim["env"]) != env:
            with contextlib.suppress(OSError):
                conn.sendall(b"other\n")
            conn.close()
            return None
        listing.give_up()  # before the answer: the command's next spare may take the lock at once
        try:
            conn.sendall(b"taken\n")
        except OSError:
            conn.close()
            return None
        return conn, claim
    return None


def _adopt(claim: dict[str, Any]) -> None:
    """Run as a controller the claimant started would: in its working directory, with its umask and its
    shell's volatile variables, its directory first on the module path."""
    os.chdir(claim["cwd"])
    os.umask(claim["umask"])
    for name in VOLATILE:
        os.environ.pop(name, None)
    os.environ.update({k: v for k, v in claim["env"].items() if k in VOLATILE})
    if "" in sys.path:  # the spare's own working directory ("/"), where Python has no -P
        sys.path.remove("")
    sys.path.insert(0, claim["cwd"])


def _waited(server: KeptServer, seconds: float) -> bool:
    """Whether ``seconds`` passed with the kept server running (False as soon as it is gone)."""
    deadline = time.monotonic() + seconds
    while server.alive():
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.1)
    return False


def _serve(spool: Path, server: KeptServer | None, env: dict[str, str]) -> tuple[bytes, dict[str, Any]] | None:
    """The job line and claim of the command this spare is to run; None when it ends unclaimed. A
    command that claims it and sends no job (its config was refused) leaves it waiting again, unless
    another spare took its place meanwhile."""
    if server is None or not enabled():
        return None
    mine = None
    while True:
        listing = _Listing(spool.parent)
        try:
            if not listing.take_lock():
                return None
            listing.record(spool)
            if mine is None:
                mine = fingerprint()  # of the files as they were before the imports read them
                if not _waited(server, START_DELAY_SECONDS):
                    return None
                _load()
            listing.open(spool)
            claimed = _await_claim(listing, server, mine, env)
        finally:
            listing.give_up()
        if claimed is None:
            return None
        conn, claim = claimed
        with conn:
            conn.settimeout(None)
            try:
                line = _read_line(conn, MAX_CLAIM_BYTES)
            except OSError:
                line = None
        if line:
            return line, claim


def main() -> int:
    """The spare's process (see the module doc); its exit code."""
    from ..foundation.startup_gc import no_collection_at_exit

    env = _settled(os.environ)  # as started: imports may add to it
    no_collection_at_exit()
    spool = Path(os.readlink("/proc/self/fd/1"))
    job = None
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # unclaimed, it ends tidily
    try:
        job = _serve(spool, _kept_server(), env)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if job is None:
            spool.unlink(missing_ok=True)
    if job is None:
        return 0
    line, claim = job
    _adopt(claim)
    from .controller_launch import run_job

    return run_job(json.loads(line), spool)


_started_early: PendingController | None = None  # by the console script, for the command to take


def start_controller_early() -> None:
    """Start the controller a command will take (:func:`take_controller`) before the CLI's own imports:
    the console script's first step for a command that runs an experiment in the background. Raises
    OSError when it cannot start."""
    global _started_early
    _started_early = _claim_or_start()


def take_controller() -> PendingController:
    """The controller started early for this command, else one started now. Raises OSError when it
    cannot start. One not taken ends by itself when this process exits (its stdin closes; a claimed spare
    waits for another command)."""
    global _started_early
    controller, _started_early = _started_early, None
    return controller if controller is not None else _claim_or_start()


def _claim_or_start() -> PendingController:
    """A spare controller of the kept server when one is ready for this command, else a new one."""
    global _controller_env
    _controller_env = dict(os.environ)
    return claim_spare() or start_controller()


_controller_env: dict[str, str] | None = None  # the environment this command's controller got


def start_next_spare() -> None:
    """After this command has handed its experiment over: a spare controller for the next command, with
    the environment this command's controller got (see the module doc). Never raises."""
    if _controller_env is not None:
        start_spare(_controller_env)
