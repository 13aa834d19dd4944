"""Servers the test harness starts in sessions of their own (Prefect's, PostgreSQL) stop by themselves
when the process that started them dies, however it dies: a killed test run leaves none behind (see
:func:`trialflow.trial.procs.watch_next_child`). Emulated containers and controllers end with their
trials, so they go without (a watchdog each would cost a process start)."""

from __future__ import annotations

import os
import subprocess
from typing import Any

from ..trial.procs import watch_next_child


def popen_owned(args: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(args, **kwargs)`` in a new session, stopped (SIGTERM, then SIGKILL) once this
    process dies. Raises OSError when the process or its watchdog cannot start."""
    held = watch_next_child(os.getpid())
    try:
        return subprocess.Popen(args, start_new_session=True, pass_fds=(held,), **kwargs)
    finally:
        os.close(held)
