"""The filesystem seam under the controller's side of the trial protocol (``trialdir``).

The protocol -- a trial directory's files, the reuse environment's boxes, installing the runtime and
code -- is written once over :class:`TrialFS`; a platform picks the filesystem its trial files live
on. :class:`LocalFS` is this machine (local trials, a share mounted here); ``sftpfs.SftpFS`` is a
machine reached over SSH. Another store (an object store through fsspec, a login node) is one more
subclass: the methods below are all the protocol needs.

Paths are POSIX strings as the filesystem itself names them. Guarantees every implementation keeps:
``write`` is atomic (readers see the old file or the whole new one) and makes missing parents;
reading or removing a missing file is not an error (``None`` / nothing happens); ``rename`` fails
with ``OSError`` when the target exists. Other failures raise ``OSError`` or ``PlatformError``
(a lost connection: ``TransientPlatformError``). Implementations are called from many threads.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import stat
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..trial.unpack import extract_stream

READ_CHUNK = 4 * 1024 * 1024
Feed = Callable[[Callable[[bytes], None]], Any]  # writes a code bundle's stream through the given sink


class TrialFS(ABC):
    """Where trial files live. ``where`` names it in messages."""

    where = ""

    @staticmethod
    def join(*parts: str) -> str:
        return posixpath.join(*parts)

    @abstractmethod
    def read(self, path: str, offset: int = 0, limit: int = READ_CHUNK) -> bytes | None:
        """Up to ``limit`` bytes from ``offset`` (-1: to the end); None when the file does not exist."""

    @abstractmethod
    def tail(self, path: str, limit: int) -> bytes:
        """The last ``limit`` bytes (b'' when the file does not exist)."""

    @abstractmethod
    def listdir(self, path: str) -> dict[str, int] | None:
        """Entries of a folder with their sizes; None when the folder does not exist."""

    @abstractmethod
    def exists(self, path: str) -> bool: ...

    @abstractmethod
    def kind(self, path: str) -> str | None:
        """``"dir"``, ``"file"``, ``"link"`` or ``"other"`` for what ``path`` itself is (a link is not
        followed); None when nothing is there."""

    @abstractmethod
    def write(self, path: str, data: bytes, mode: int | None = None) -> None:
        """Write the whole file atomically (``mode``: its permissions from the start)."""

    @abstractmethod
    def touch(self, path: str, data: bytes = b"") -> None:
        """Write in place (a heartbeat's mtime, a stop request); the folder must exist."""

    @abstractmethod
    def remove(self, path: str) -> None:
        """Remove a file; a missing one is not an error."""

    @abstractmethod
    def makedirs(self, path: str) -> None: ...

    @abstractmethod
    def put(self, source: Path, path: str) -> None:
        """Copy a local file to ``path`` (its folder exists)."""

    @abstractmethod
    def rename(self, source: str, target: str) -> None:
        """Rename; ``OSError`` when ``target`` exists."""

    @abstractmethod
    def remove_tree(self, path: str) -> None:
        """Remove a folder and what it holds (best effort)."""

    @abstractmethod
    def extract(self, target: str, digest: str, feed: Feed) -> int:
        """Extract the tar stream ``feed`` writes into ``target`` (checked against ``digest``, never
        outside ``target``); returns the bytes sent. Raises ``PlatformError`` when it fails."""

    @abstractmethod
    def download(self, path: str, local: Path) -> None:
        """Copy the file or folder ``path`` to ``local`` on this machine (links are not followed;
        nothing lands outside ``local``); a missing one copies nothing."""


class LocalFS(TrialFS):
    """This machine's filesystem (local trial folders, a share mounted here)."""

    where = "this machine"

    def read(self, path: str, offset: int = 0, limit: int = READ_CHUNK) -> bytes | None:
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                return f.read(limit)
        except FileNotFoundError:
            return None
        except OSError:  # unreadable for now (a share hiccup): the next read tries again
            return b""

    def tail(self, path: str, limit: int) -> bytes:
        try:
            with open(path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - limit))
                return f.read()
        except OSError:
            return b""

    def listdir(self, path: str) -> dict[str, int] | None:
        try:
            with os.scandir(path) as entries:
                found = list(entries)
        except (FileNotFoundError, NotADirectoryError):
            return None
        sizes = {}
        for entry in found:
            try:
                sizes[entry.name] = entry.stat().st_size
            except FileNotFoundError:  # renamed or removed since the listing (a writer's temporary file)
                continue
        return sizes

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def kind(self, path: str) -> str | None:
        try:
            return mode_kind(os.lstat(path).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            return None

    def write(self, path: str, data: bytes, mode: int | None = None) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp{os.getpid()}-{threading.get_ident()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666 if mode is None else mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def touch(self, path: str, data: bytes = b"") -> None:
        with open(path, "wb") as f:
            f.write(data)

    def remove(self, path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def put(self, source: Path, path: str) -> None:
        shutil.copyfile(source, path)

    def rename(self, source: str, target: str) -> None:
        if os.path.exists(target):
            raise FileExistsError(target)
        os.rename(source, target)

    def remove_tree(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def extract(self, target: str, digest: str, feed: Feed) -> int:
        read_fd, write_fd = os.pipe()
        sent = [0]
        with os.fdopen(read_fd, "rb") as reader, os.fdopen(write_fd, "wb") as writer:
            def write(chunk: bytes) -> None:
                writer.write(chunk)
                sent[0] += len(chunk)

            def run_feed() -> None:
                feed(write)
                writer.close()

            feeder = threading.Thread(target=run_feed, daemon=True)
            feeder.start()
            extract_stream(reader, target, digest)
            feeder.join()
        return sent[0]

    def download(self, path: str, local: Path) -> None:
        if os.path.isdir(path):
            shutil.copytree(path, local, symlinks=True, dirs_exist_ok=True)
        elif os.path.isfile(path):
            local.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, local)


def mode_kind(mode: int) -> str:
    """What an ``lstat`` mode names: ``"dir"``, ``"file"``, ``"link"`` or ``"other"``."""
    if stat.S_ISLNK(mode):
        return "link"
    if stat.S_ISDIR(mode):
        return "dir"
    return "file" if stat.S_ISREG(mode) else "other"
