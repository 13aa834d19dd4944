"""A share mounted on this machine and in the trials' machines or containers, seen at a different path
in each: its layout, its checks, and installing the trial runtime and code bundles on it once. Job
platforms (``localMountPoint`` / the container path) and NNI's ``sharedStorage`` both use it.

Every method may be called from many threads; installs are atomic (a ``.partial`` folder renamed),
so concurrent controllers never see half a runtime or half a code bundle."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

from .errors import PlatformError
from .ownership import claim, owned_folders
from .trialdir import LOCAL, install_code, install_tree, scan_bundle


class MountedShare:
    """The share as this machine sees it (``local``) and as containers see it (``container``).
    Layout under both::

        nni/runtime/<version>-<hash>/   the trial runtime (keeper, worker, nni package)
        nni/code/<content hash>/        extracted code bundles
        nni/<experiment>/trials/<id>/   trial directories
        nni/<experiment>/envs/<id>/     reuse-mode environments
    """

    def __init__(self, local: Path | None, container: str, what: str) -> None:
        self._local = local
        self.container = container.rstrip("/")
        self.what = what
        self._lock = threading.Lock()

    @property
    def local(self) -> Path:
        if self._local is None:
            raise PlatformError(f"{self.what} is not mounted on this machine: mount it (for NFS: sudo mount -t nfs "
                                "<server>:<path> <folder>) and set its localMountPoint to that folder")
        return self._local

    def check(self) -> None:
        if not self.local.is_dir():
            raise PlatformError(f"localMountPoint {self.local} of {self.what} is not a directory; mount the share "
                                "there first")
        if not os.access(self.local, os.W_OK):
            raise PlatformError(f"localMountPoint {self.local} of {self.what} is not writable by this user "
                                "(NFS root_squash? give the export to this user)")

    def path(self, *parts: str) -> Path:
        return self.local.joinpath("nni", *parts)

    def container_path(self, *parts: str) -> str:
        return "/".join([self.container, "nni", *parts])

    def claim(self, experiment_id: str) -> None:
        """Mark ``nni/code``, ``nni/runtime`` and the experiment's folder as trialflow's (what
        :meth:`clean` may remove)."""
        claim(LOCAL, str(self.path()), experiment_id)

    def clean(self, dry_run: bool = False) -> list[str]:
        """Remove trialflow's marked folders from ``nni/`` on the share (runtimes, code bundles, the
        experiments' folders; see :mod:`~trialflow.platforms.ownership`), nothing else. Returns what
        was (``dry_run``: would be) removed."""
        self.check()
        removed = []
        for folder in owned_folders(LOCAL, str(self.path())):
            if not dry_run:
                shutil.rmtree(folder)
            removed.append(f"{self.what}: {folder}")
        return removed

    def install_runtime(self, key: str, files: list[tuple[str, Path]]) -> None:
        install_tree(LOCAL, str(self.path("runtime", key)), files)

    def install_code(self, code_dir: Path, experiment_dir: Path) -> str:
        """Extract the code bundle once per content hash; returns the hash."""
        bundle, digest = scan_bundle(code_dir, experiment_dir)
        with self._lock:
            install_code(LOCAL, str(self.path("code", digest)), digest, bundle.stream)
        return digest
