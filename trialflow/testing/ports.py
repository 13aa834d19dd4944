"""Loopback ports for servers that tests and benchmarks start in processes of their own (sshd,
PostgreSQL, Slurm, a Prefect server, NNI's manager), which take a port number, not a socket.

A port found free here is free only until someone binds it. Asked from the kernel (``bind(port=0)``)
it comes from the ephemeral range, where every outgoing connection of the machine also takes its
local port: with a suite's thousands of HTTP connections, one of them can take the port before the
server binds it, and the server exits. :func:`free_port` picks below that range, where the kernel
never hands out ports by itself, so only another program that chose the same number can collide.
"""

from __future__ import annotations

import random
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

HOST = "127.0.0.1"
LOWEST = 10000  # below: well-known and registered services a machine may run
EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
TRIES = 100


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


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now, below the ephemeral range when the range leaves room
    there (else any free port the kernel gives). Lifecycle: nothing is held; bind it soon."""
    top = _ephemeral_start()
    if top - LOWEST >= 1000:
        for port in random.sample(range(LOWEST, top), TRIES):
            if _free(port):
                return port
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def wait_serving(ready: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path, what: str,
                 timeout: float) -> None:
    """Return once ``ready()`` (the server ``proc`` started answers); raises RuntimeError with the end of
    its ``log`` when it exits first, or when ``timeout`` seconds pass (the caller stops it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited: {log.read_text()[-2000:]}")
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not answer within {timeout} s")
