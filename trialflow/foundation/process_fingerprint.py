"""What a process shares with another of this user that would take over its work (a spare controller
and the command that claims it), besides the environment: :func:`fingerprint`, and :func:`umask`.

Standard library only.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import resource
import sys
from pathlib import Path

LIBRARIES = ("prefect", "optuna", "pydantic", "sqlalchemy")  # their files are part of the fingerprint


def fingerprint() -> str:
    """What a spare shares with its claimant besides the environment: the Python, the files of trialflow
    and of the libraries a run imports (a changed file would leave the spare running old code), the
    user's groups, CPUs, resource limits, priority and control groups."""
    parts: list[object] = [sys.executable, sys.version, sorted(os.getgroups()), sorted(os.sched_getaffinity(0)),
                           os.getpriority(os.PRIO_PROCESS, 0)]
    parts += [resource.getrlimit(limit) for limit in (
        resource.RLIMIT_NOFILE, resource.RLIMIT_NPROC, resource.RLIMIT_AS, resource.RLIMIT_CORE,
        resource.RLIMIT_STACK, resource.RLIMIT_CPU, resource.RLIMIT_FSIZE, resource.RLIMIT_MEMLOCK)]
    with contextlib.suppress(OSError):
        parts.append(Path("/proc/self/cgroup").read_text())
    files = []
    for folder, dirs, names in os.walk(Path(__file__).resolve().parents[1]):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        files += [os.path.join(folder, name) for name in names if name.endswith(".py")]
    for library in LIBRARIES:
        try:
            spec = importlib.util.find_spec(library)
        except (ImportError, ValueError):
            spec = None
        files.append(str(spec.origin) if spec is not None else library)
    for path in sorted(files):
        try:
            stat = os.stat(path)
            parts.append((path, stat.st_mtime_ns, stat.st_size))
        except OSError:
            parts.append(path)
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def umask() -> int:
    """This process's umask, read without changing it."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Umask:"):
            return int(line.split()[1], 8)
    return 0o022
