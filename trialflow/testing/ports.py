"""Loopback ports for servers that tests and benchmarks start in processes of their own (sshd,
PostgreSQL, Slurm, a Prefect server, NNI's manager), which take a port number, not a socket.

A port found free here is free only until someone binds it. Asked from the kernel (``bind(port=0)``)
it comes from the ephemeral range, where every outgoing connection of the machine also takes its
local port: with a suite's thousands of HTTP connections, one of them can take the port before the
server binds it, and the server exits. :func:`free_port` picks below that range, where the kernel
never hands out ports by itself, so only another program that chose the same number can collide. Each
pytest-xdist worker picks from a slice of its own, so the suite's workers never choose alike; for the
rest (another program, two servers of one worker starting at once), :func:`on_a_free_port` starts a
server again on another port when it exits because its port was taken (:class:`PortTaken`).
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

HOST = "127.0.0.1"
LOWEST = 10000  # below: well-known and registered services a machine may run
EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
TRIES = 100
STARTS = 3  # launches of one server on as many ports before a taken port is the caller's error
TAKEN = "already in use"  # what Prefect, sshd, PostgreSQL, uvicorn and Slurm log when their bind fails that way

T = TypeVar("T")


class PortTaken(RuntimeError):
    """A server exited because another program bound its port between :func:`free_port` and its own bind."""


def _ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (Linux's default 32768 where it cannot be read)."""
    try:
        with open(EPHEMERAL_RANGE) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def _candidates() -> range:
    """The ports :func:`free_port` picks from: those below the ephemeral range, or this pytest-xdist
    worker's slice of them (empty when the range leaves no room)."""
    below = range(LOWEST, max(LOWEST, _ephemeral_start()))
    worker, workers = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if worker.startswith("gw") and worker[2:].isdigit() and workers.isdigit() and int(workers) > 1:
        width = len(below) // int(workers)
        index = int(worker[2:]) % int(workers)
        if width >= 1000:
            return below[index * width:(index + 1) * width]
    return below if len(below) >= 1000 else range(0)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now, below the ephemeral range when the range leaves room
    there (else any free port the kernel gives). Lifecycle: nothing is held; bind it soon."""
    candidates = _candidates()
    if candidates:
        for port in random.sample(candidates, min(TRIES, len(candidates))):
            if _free(port):
                return port
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def log_size(log: Path) -> int:
    """The size of ``log`` in bytes (0 when it does not exist yet): where a launch appending to it begins."""
    try:
        return log.stat().st_size
    except FileNotFoundError:
        return 0


def exit_error(message: str, logged: str) -> RuntimeError:
    """The error to raise, saying ``message``, for a server that exited having logged ``logged``:
    :class:`PortTaken` when that says its port was in use, else RuntimeError."""
    return (PortTaken if TAKEN in logged.lower() else RuntimeError)(message)


def wait_serving(ready: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path, what: str,
                 timeout: float, poll: float = 0.2, log_from: int = 0) -> None:
    """Return once ``ready()`` (the server ``proc`` started answers); raises RuntimeError with the end of
    its ``log`` when it exits first (:class:`PortTaken` when the log says its port was in use), or when
    ``timeout`` seconds pass (the caller stops it). Asks every ``poll`` seconds. Only what the log holds
    from byte ``log_from`` on is this launch's (a log appended to across launches: its
    :func:`log_size` before the launch)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        if proc.poll() is not None:
            with open(log, "rb") as f:
                f.seek(log_from)
                said = f.read().decode(errors="replace")[-2000:]
            raise exit_error(f"{what} exited: {said}", said)
        time.sleep(poll)
    raise RuntimeError(f"{what} did not answer within {timeout} s")


def answers_health(url: str) -> bool:
    """Whether a GET of ``url`` (a server's health endpoint) answers 200 within 2 s."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def on_a_free_port(start: Callable[[int], T]) -> T:
    """``start(port)`` with a port from :func:`free_port`; when it raises :class:`PortTaken` (having
    stopped what it launched), again with another port, up to :data:`STARTS` launches in all. Raises
    what ``start`` raises, the last PortTaken included."""
    for _ in range(STARTS - 1):
        try:
            return start(free_port())
        except PortTaken:
            continue
    return start(free_port())
