"""A machine's filesystem over SFTP, as the trial protocol reads and writes it (see ``trialfs``).

Each call is one SFTP exchange on the connection's session; a lost connection is retried once on a
new one and then raises ``TransientPlatformError`` (``SshConnection.sftp_call``). Extracting a code
bundle runs the runtime's ``unpack`` module on the machine over SSH, with the bundle as its stdin.
"""

from __future__ import annotations

import posixpath
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paramiko

from .errors import PlatformError
from .ssh import SshConnection
from .trialfs import READ_CHUNK, Feed, TrialFS, mode_kind


class SftpFS(TrialFS):
    """The files of the machine behind ``conn``; ``unpack_command(target, digest)`` is the shell
    command that extracts a bundle read from stdin there."""

    def __init__(self, conn: SshConnection, where: str, unpack_command: Callable[[str, str], str]) -> None:
        self.conn = conn
        self.where = where
        self._unpack_command = unpack_command

    def _call(self, what: str, call: Callable[[paramiko.SFTPClient], Any]) -> Any:
        return self.conn.sftp_call(f"{what} on {self.where}", call)

    def read(self, path: str, offset: int = 0, limit: int = READ_CHUNK) -> bytes | None:
        def read(sftp: paramiko.SFTPClient) -> bytes | None:
            try:
                with sftp.open(path, "rb") as f:
                    f.seek(offset)
                    return bytes(f.read(limit))
            except FileNotFoundError:
                return None

        return self._call(f"reading {path}", read)  # type: ignore[no-any-return]

    def tail(self, path: str, limit: int) -> bytes:
        def tail(sftp: paramiko.SFTPClient) -> bytes:
            try:
                with sftp.open(path, "rb") as f:
                    size = f.stat().st_size or 0
                    f.seek(max(0, size - limit))
                    return bytes(f.read(limit))
            except FileNotFoundError:
                return b""

        return self._call(f"reading {path}", tail)  # type: ignore[no-any-return]

    def listdir(self, path: str) -> dict[str, int] | None:
        def listdir(sftp: paramiko.SFTPClient) -> dict[str, int] | None:
            try:
                return {a.filename: a.st_size or 0 for a in sftp.listdir_attr(path)}
            except FileNotFoundError:
                return None

        return self._call(f"listing {path}", listdir)  # type: ignore[no-any-return]

    def exists(self, path: str) -> bool:
        return bool(self._call(f"looking for {path}", lambda sftp: _exists(sftp, path)))

    def kind(self, path: str) -> str | None:
        def kind(sftp: paramiko.SFTPClient) -> str | None:
            try:
                return mode_kind(sftp.lstat(path).st_mode or 0)
            except FileNotFoundError:
                return None

        return self._call(f"looking at {path}", kind)  # type: ignore[no-any-return]

    def write(self, path: str, data: bytes, mode: int | None = None) -> None:
        def write(sftp: paramiko.SFTPClient) -> None:
            _mkdirs(sftp, posixpath.dirname(path))
            tmp = f"{path}.tmp"
            with sftp.open(tmp, "wb") as f:
                if mode is not None:
                    f.chmod(mode)
                f.write(data)
            sftp.posix_rename(tmp, path)

        self._call(f"writing {path}", write)

    def touch(self, path: str, data: bytes = b"") -> None:
        def touch(sftp: paramiko.SFTPClient) -> None:
            with sftp.open(path, "wb") as f:
                f.write(data)

        self._call(f"writing {path}", touch)

    def remove(self, path: str) -> None:
        def remove(sftp: paramiko.SFTPClient) -> None:
            try:
                sftp.remove(path)
            except FileNotFoundError:
                pass

        self._call(f"removing {path}", remove)

    def makedirs(self, path: str) -> None:
        self._call(f"making {path}", lambda sftp: _mkdirs(sftp, path))

    def put(self, source: Path, path: str) -> None:
        self._call(f"copying {path}", lambda sftp: sftp.put(str(source), path))

    def rename(self, source: str, target: str) -> None:
        def rename(sftp: paramiko.SFTPClient) -> None:
            if _exists(sftp, target):
                raise FileExistsError(target)
            sftp.posix_rename(source, target)

        self._call(f"renaming {source}", rename)

    def remove_tree(self, path: str) -> None:
        def remove(sftp: paramiko.SFTPClient, folder: str) -> None:
            try:
                entries = sftp.listdir_attr(folder)
            except OSError:
                return
            for entry in entries:
                child = posixpath.join(folder, entry.filename)
                if stat.S_ISDIR(entry.st_mode or 0):
                    remove(sftp, child)
                else:
                    sftp.remove(child)
            sftp.rmdir(folder)

        self._call(f"removing {path}", lambda sftp: remove(sftp, path))

    def extract(self, target: str, digest: str, feed: Feed) -> int:
        sent = [0]

        def counted(send: Callable[[bytes], None]) -> Any:
            def write(chunk: bytes) -> None:
                send(chunk)
                sent[0] += len(chunk)

            return feed(write)

        _, status, _out, err = self.conn.run_streaming(self._unpack_command(target, digest), counted)
        if status != 0:
            raise PlatformError(f"{self.where}: extracting the code bundle failed: {err.strip()[-500:]}")
        return sent[0]

    def download(self, path: str, local: Path) -> None:
        self._call(f"fetching {path}", lambda sftp: _download(sftp, path, local))


def _exists(sftp: paramiko.SFTPClient, path: str) -> bool:
    try:
        sftp.stat(path)
        return True
    except FileNotFoundError:
        return False


def _mkdirs(sftp: paramiko.SFTPClient, path: str) -> None:
    missing = []
    while path not in ("", "/"):
        try:
            if stat.S_ISDIR(sftp.stat(path).st_mode or 0):
                break
            raise PlatformError(f"{path} exists on the worker and is not a directory")
        except FileNotFoundError:
            missing.append(path)
            path = posixpath.dirname(path)
    for directory in reversed(missing):
        try:
            sftp.mkdir(directory)
        except OSError:
            if not _exists(sftp, directory):
                raise


def _download(sftp: paramiko.SFTPClient, remote: str, local: Path) -> None:
    """``remote`` (a file, or a folder copied entry by entry; entries are plain names, so nothing
    lands outside ``local``); symbolic links are not followed."""
    try:
        mode = sftp.stat(remote).st_mode or 0
    except FileNotFoundError:
        return
    if stat.S_ISREG(mode):
        local.parent.mkdir(parents=True, exist_ok=True)
        sftp.get(remote, str(local))
        return
    local.mkdir(parents=True, exist_ok=True)
    for entry in sftp.listdir_attr(remote):
        name, entry_mode = entry.filename, entry.st_mode or 0
        if name in (".", "..") or "/" in name:
            continue
        if stat.S_ISDIR(entry_mode) or stat.S_ISREG(entry_mode):
            _download(sftp, posixpath.join(remote, name), local / name)
