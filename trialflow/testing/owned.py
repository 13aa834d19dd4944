"""Servers the test harness starts in sessions of their own (Prefect's, PostgreSQL, sshd) stop by
themselves when the process that started them dies, however it dies: a killed test run leaves none
behind (see :func:`trialflow.trial.procs.watch_next_child` and :func:`trialflow.trial.procs.stop_with`).
Emulated containers and controllers end with their trials, so they go without (a watchdog each would
cost a process start)."""

from __future__ import annotations

import os
import subprocess
from typing import Any

from ..trial.procs import stop_with, watch_next_child


def popen_owned(args: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(args, **kwargs)`` in a new session, stopped (SIGTERM, then SIGKILL) once this
    process dies. Raises OSError when the process or its watchdog cannot start."""
    held = watch_next_child(os.getpid())
    try:
        return subprocess.Popen(args, start_new_session=True, pass_fds=(held,), **kwargs)
    finally:
        os.close(held)


def popen_watched(args: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """Like :func:`popen_owned`, for a server that closes the descriptors it inherits (sshd), which would
    end :func:`popen_owned`'s watchdog: this one watches the process group by its leader's pid and start
    time from the moment the process exists, until this process dies. Raises OSError when the process or
    its watchdog cannot start."""
    proc: subprocess.Popen[bytes] = subprocess.Popen(args, start_new_session=True, **kwargs)
    try:
        stop_with(os.getpid(), proc.pid)
    except OSError:
        proc.kill()
        proc.wait()
        raise
    return proc
