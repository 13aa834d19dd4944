"""The trial runtime as it travels to workers and shared storage: its files and a content key.

Remote machines get it over SFTP and Kubernetes pods through the shared storage, each under
``runtime/<key>/``; the key changes with any byte of the runtime, so a stale copy is never reused.
"""

from __future__ import annotations

import functools
from pathlib import Path

from .. import __version__
from ..trial import RUNTIME_ROOT
from .errors import PlatformError


def runtime_files() -> list[tuple[str, Path]]:
    """The files of the trial runtime: ``trialflow/__init__.py`` and the ``trialflow.trial`` package."""
    root = Path(RUNTIME_ROOT)
    package = root / "trialflow" / "trial"
    files = [("trialflow/__init__.py", root / "trialflow" / "__init__.py")]
    for path in sorted(package.rglob("*.py")):
        if "__pycache__" not in path.parts:
            files.append((path.relative_to(root).as_posix(), path))
    return files


@functools.cache
def runtime_key() -> str:
    import hashlib

    sha = hashlib.sha256()
    for rel, path in runtime_files():
        sha.update(rel.encode() + b"\0" + path.read_bytes() + b"\0")
    return f"{__version__}-{sha.hexdigest()[:16]}"


class VersionMismatchError(PlatformError):
    """The runtime on a worker is not the controller's major.minor version."""


def check_version(remote: str, where: str, fix: str, controller: str | None = None) -> None:
    """Raise VersionMismatchError unless ``remote`` has the controller's major.minor version."""
    controller = controller or __version__
    if remote.split(".")[:2] != controller.split(".")[:2]:
        raise VersionMismatchError(f"{where} runs trialflow {remote} but this controller is trialflow {controller}; "
                                   f"major.minor must match: {fix}")
