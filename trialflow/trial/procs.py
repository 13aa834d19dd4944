"""Process helpers shared by the controller and workers (standard library only, Linux ``/proc``).

``kill_group`` stops a whole trial: SIGINT, then SIGTERM, then SIGKILL to its process group, a
grace period apart. ``pid_alive`` treats zombies as dead; ``process_start_time`` guards against a
recycled pid (a pid plus its start time names one process for good).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import time
from typing import Any

NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})  # a full disk, a spent quota


def with_this_trialflow(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the folder this trialflow is imported from first on PYTHONPATH: a ``python -m
    trialflow...`` child imports the same trialflow as this process, wherever it is started."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)}


def write_atomic(path: str, data: dict[str, Any] | str) -> None:
    """Write JSON (or text as it is) so that readers see the old file or the whole new one, never a part."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(data if isinstance(data, str) else json.dumps(data))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # a full disk, say: no half-written file is left behind
            os.unlink(tmp)
        raise


def write_when_space(path: str, data: dict[str, Any] | str, retry_seconds: float = 2.0) -> None:
    """:func:`write_atomic`, waiting while the disk is full (or the quota spent) until it can write:
    a trial's end must be recorded, however long the user takes to free space. Other errors raise."""
    while True:
        try:
            write_atomic(path, data)
            return
        except OSError as exc:
            if exc.errno not in NO_SPACE_ERRNOS:
                raise
        time.sleep(retry_seconds)


def read_json(path: str, dir_fd: int | None = None) -> dict[str, Any] | None:
    """The JSON object in ``path`` (relative to the open directory ``dir_fd`` when given); None when the
    file is missing, unreadable or holds no object."""
    try:
        with open(path, encoding="utf-8", opener=lambda name, flags: os.open(name, flags, dir_fd=dir_fd)) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def stat_fields(text: str) -> list[str]:
    """The fields of a ``/proc/<pid>/stat`` line after the command name: state first."""
    return text.rsplit(")", 1)[1].split()


def stat_alive(fields: list[str], start_time: int | None) -> bool:
    """Not a zombie and, when ``start_time`` is given, the process that started then (not a recycled pid)."""
    return fields[0] != "Z" and (start_time is None or int(fields[19]) == start_time)


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return stat_fields(f.read())
    except (OSError, IndexError):
        return None


def process_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22)."""
    fields = _stat_fields(pid)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def daemonize(log_path: str) -> int:
    """Fork; the child leads a new session with stdin on /dev/null and stdout/stderr appended to
    ``log_path`` (so it survives the SSH session or the process that started it). Returns like
    ``os.fork``: 0 in the child, the child's pid (= its process group) in the parent."""
    pid = os.fork()
    if pid != 0:
        return pid
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for fd, target in ((0, devnull), (1, log), (2, log)):
        os.dup2(target, fd)
    for fd in {devnull, log} - {0, 1, 2}:
        os.close(fd)
    return 0


def pid_alive(pid: int, start_time: int | None = None) -> bool:
    """True while ``pid`` runs and is not a zombie (and, when given, started at ``start_time``)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = _stat_fields(pid)
    if fields is None:
        return True  # no /proc: trust kill(0)
    return stat_alive(fields, start_time)


def group_alive(pgid: int) -> bool:
    """True while any non-zombie process is in the group (an exited keeper's zombie does not count)."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            try:
                if fields and int(fields[2]) == pgid and fields[0] != "Z":
                    return True
            except (IndexError, ValueError):
                continue
    return False


def kill_group(pgid: int, grace: float) -> None:
    """SIGINT, SIGTERM, then SIGKILL to the process group ``pgid``, ``grace`` seconds apart, and up to
    ``grace`` more for the group to end after the SIGKILL (the kernel ends a killed process when it gets
    to it: later on a busy machine). Returns once the group is gone or that time is up."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if not group_alive(pgid):
                return
            time.sleep(0.02)


# A watchdog: waits for the owner's death (pidfd, or polling), then stops the watched process group (or
# the process, when it leads none) -- the same one, checked by its leader's start time, never a group
# that took its pid later. Given "-" for the leader, it watches whichever processes hold the write end
# of the pipe on its stdin (see watch_next_child): at EOF they are all gone and it ends.
_WATCHDOG = r"""
import os, select, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)

def start_time(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except OSError:
        return None

def owner_dies(owner, also):
    try:
        fd = os.pidfd_open(owner)
    except (AttributeError, OSError):
        fd = None
    while True:
        ready = select.select([fd, *also] if fd is not None else also, [], [], None if fd is not None else 0.5)[0]
        if also and also[0] in ready and not os.read(also[0], 512):
            return False  # every holder of the pipe is gone
        if (fd is not None and fd in ready) or (fd is None and start_time(owner) is None):
            return True

def holders(pipe):
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
            except OSError:
                continue
            for fd in fds:
                try:
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == pipe:
                        found.append(int(pid))
                        break
                except OSError:
                    pass
    return found

def stop(leader, started):
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0.0)):
        if start_time(leader) != started:
            break
        try:
            os.killpg(leader, sig)
        except OSError:  # not a group leader after all: the process alone
            os.kill(leader, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and start_time(leader) == started:
            time.sleep(0.1)

owner = int(sys.argv[1])
if sys.argv[2] == "-":
    pipe = f"pipe:[{os.fstat(0).st_ino}]"
    if owner_dies(owner, [0]):
        for leader in holders(pipe):
            started = start_time(leader)
            if started is not None:  # not gone in between
                stop(leader, started)
else:
    owner_dies(owner, [])
    stop(int(sys.argv[2]), sys.argv[3])
"""


def stop_with(owner: int, leader: int) -> bool:
    """Stop the process group led by ``leader`` (SIGTERM, then SIGKILL after 5 s) when process ``owner``
    dies, however it dies (SIGKILL included): a small watchdog process in a session of its own, which
    ends by itself once the group is gone. False when ``leader`` is not running. Raises OSError when
    the watchdog cannot start."""
    import subprocess
    import sys

    started = process_start_time(leader)
    if started is None:
        return False
    subprocess.Popen([sys.executable, "-S", "-c", _WATCHDOG, str(owner), str(leader), str(started)],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True, close_fds=True)
    return True


def watch_next_child(owner: int) -> int:
    """:func:`stop_with` for a child not started yet, with no moment in which ``owner`` can die and leave
    it unwatched: the watchdog starts first, holding the read end of a pipe, and stops whichever
    processes hold its write end once ``owner`` dies. Returns that write end: start the child with it
    in ``pass_fds`` (it keeps it, unused, for its life), then close it here whether the start succeeded
    or not; the watchdog ends by itself when no process holds it any more. Raises OSError when the
    watchdog cannot start."""
    import subprocess
    import sys

    read_end, write_end = os.pipe()
    try:
        subprocess.Popen([sys.executable, "-S", "-c", _WATCHDOG, str(owner), "-"], stdin=read_end,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                         close_fds=True)
    except OSError:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    return write_end
