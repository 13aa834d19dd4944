"""Local processes standing in for containers, shared by the platform emulators.

A container runs as a local process in its own session, with this Python first on ``PATH``. Container
paths under a mount are rewritten to their local folders in the command and the environment
(:func:`map_mounts`), so a job sees the share where its controller put it. :func:`kill_tree` ends a
process and every descendant, also those that left its session (detached keepers).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        tree.setdefault(int(fields[1]), []).append(int(entry))
    return tree


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def tree_of(pid: int) -> list[int]:
    """A process and all its descendants (also those in other sessions), the process first."""
    tree = _children()
    pids, todo = [], [pid]
    while todo:
        current = todo.pop()
        pids.append(current)
        todo.extend(tree.get(current, []))
    return pids


def stop_container(pid: int, grace: float) -> None:
    """As a container runtime stops a container: SIGTERM to its first process, then SIGKILL after
    ``grace`` to every process the container held (taken before the SIGTERM, so none that the first
    process's end orphaned escapes)."""
    pids = tree_of(pid)
    try:
        os.kill(pid, signal.SIGTERM)
    except OSError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    for p in pids + tree_of(pid)[1:]:
        if _alive(p):
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass


def kill_tree(pid: int, grace: float) -> None:
    """SIGTERM a process and all its descendants (also those in other sessions), SIGKILL after ``grace``."""
    pids = tree_of(pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in pids:
            try:
                os.kill(p, sig)
            except OSError:
                pass
        deadline = time.monotonic() + grace
        while sig == signal.SIGTERM and time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.05)


def map_mounts(text: str, mounts: list[tuple[str, str]]) -> str:
    """``text`` with every container path under a mount (``(container path, local folder)``)
    rewritten to its local folder; the longest mount wins."""
    for container_path, local in sorted(mounts, key=lambda m: -len(m[0])):
        container_path = container_path.rstrip("/") or "/"
        text = re.sub(rf"(?<![\w/.]){re.escape(container_path)}(?=/|\s|$|[\"';&|)])", local, text)
    return text


def base_env(hostname: str) -> dict[str, str]:
    """The environment every emulated container starts from."""
    return {"PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
            "HOSTNAME": hostname, "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}


class ContainerProcess:
    """One container of an emulated job: a shell script (its lines run by ``sh -e``), container paths
    mapped to local folders, stdout and stderr appended to ``log_path``. ``start`` returns at once;
    ``exit_code`` is None while it runs (negative signals are reported as 128+N, as a container's)."""

    def __init__(self, lines: list[str], mounts: list[tuple[str, str]], env: dict[str, str], log_path: Path,
                 hostname: str) -> None:
        self.script = map_mounts("\n".join(lines), mounts) + "\n"
        self.env = {**base_env(hostname), **{k: map_mounts(v, mounts) for k, v in env.items()}}
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.killed = False

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(["sh", "-e", "-c", self.script], env=self.env, stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    @property
    def exit_code(self) -> int | None:
        if self.proc is None:
            return None
        code = self.proc.poll()
        if code is None:
            return None
        return 128 - code if code < 0 else code

    def kill(self, grace: float) -> None:
        self.killed = True
        if self.proc is not None and self.proc.poll() is None:
            kill_tree(self.proc.pid, grace)
            self.proc.wait()
