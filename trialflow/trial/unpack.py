"""Safe extraction of a code bundle on a worker (standard library only).

``python -S -m trialflow.trial.unpack <target dir> [<sha256>]`` reads a tar stream on stdin and
extracts it into ``<target dir>`` atomically: members go to a temporary sibling directory that is
renamed to the target only when the whole stream was valid (and, when given, its SHA-256 matches),
so a half-sent or tampered bundle never becomes visible. Refused, with the member named: absolute
paths, ``..`` components, links whose target leaves the bundle or passes through another link (so a
chain of links can never lead outside), hard links, devices and FIFOs; malformed headers (a PAX
record of a bad shape, a negative or oversized size); and more than the upload's limits (2000
files, 300 MB). A target that already exists is left alone (bundles are keyed by content, so it is
the same).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tarfile
import threading
from collections import deque
from collections.abc import Iterator
from typing import IO

from .protocol import MAX_CODE_BYTES, MAX_CODE_FILES

CHUNK = 1 << 20
MAX_MEMBERS = 10 * MAX_CODE_FILES  # files, directories and links
MAX_HEADER_BYTES = 1 << 20  # a PAX header or a GNU long name
READ_AHEAD = 256 * CHUNK
_ZERO_BLOCK = bytes(tarfile.BLOCKSIZE)


class UnsafeArchiveError(ValueError):
    """The archive has a member that would land outside the target or is of a refused kind."""


def check_member(member: tarfile.TarInfo, links: dict[str, set[str]] | None = None) -> str:
    """The member's normalised relative path; raises UnsafeArchiveError when it is not allowed.
    ``links`` (each extracted link -> the paths its target passes through) gets a link member added."""
    name = member.name
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise UnsafeArchiveError(f"archive member {name!r} has an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafeArchiveError(f"archive member {name!r} contains '..' (path traversal)")
    if not (member.isfile() or member.isdir() or member.issym()):
        raise UnsafeArchiveError(f"archive member {name!r} is a {_kind(member)}; only files, directories and "
                                 "symbolic links are allowed")
    rel = "/".join(parts)
    if member.issym():
        links = {} if links is None else links
        target = member.linkname
        if target.startswith("/"):
            raise UnsafeArchiveError(f"archive member {name!r} links to {target!r}, outside the bundle")
        passes = _follow(name, parts[:-1], target, links)
        if any(rel in earlier for earlier in links.values()):
            raise UnsafeArchiveError(f"archive member {name!r} is a link that an earlier link passes through: "
                                     "links to links are not allowed")
        links[rel] = passes
    return rel


def _follow(name: str, start: list[str], target: str, links: dict[str, set[str]]) -> set[str]:
    """The paths a link in ``start`` to ``target`` passes through, walked one component at a time: it
    may not go above the bundle, nor through a link (whose own target would make the path mean another;
    so every link's path means what it says, and lexical checks are exact)."""
    where, passes = list(start), set()
    for part in target.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not where:
                raise UnsafeArchiveError(f"archive member {name!r} links to {target!r}, outside the bundle")
            where.pop()
            continue
        where.append(part)
        path = "/".join(where)
        if path in links:
            raise UnsafeArchiveError(f"archive member {name!r} links to {target!r}, through the link {path!r}: "
                                     "links to links are not allowed")
        passes.add(path)
    return passes


def _kind(member: tarfile.TarInfo) -> str:
    if member.islnk():
        return "hard link"
    if member.isdev():
        return "device"
    if member.isfifo():
        return "FIFO"
    return "special file"


class _Source:
    """The tar stream, read ahead by a thread (up to READ_AHEAD bytes) so that the sender is never
    stalled while the extractor waits on the file system (creating files is slow on many disks);
    everything read is hashed. Small reads are served from a buffer without copying it."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.sha = hashlib.sha256()
        self._chunks: deque[bytes] = deque()
        self._queued = 0
        self._eof = False
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        self._buf = bytearray()
        self._pos = 0
        threading.Thread(target=self._fill, daemon=True).start()

    def _fill(self) -> None:
        try:
            while True:
                data = self.raw.read(CHUNK)
                self.sha.update(data)
                with self._cond:
                    while self._queued >= READ_AHEAD:
                        self._cond.wait()
                    if data:
                        self._chunks.append(data)
                        self._queued += len(data)
                    else:
                        self._eof = True
                    self._cond.notify_all()
                if not data:
                    return
        except BaseException as exc:  # noqa: BLE001 -- handed to the extracting thread
            with self._cond:
                self._error, self._eof = exc, True
                self._cond.notify_all()

    def _next_chunk(self) -> bytes:
        with self._cond:
            while not self._chunks and not self._eof:
                self._cond.wait()
            if self._error is not None:
                raise self._error
            if not self._chunks:
                return b""
            chunk = self._chunks.popleft()
            self._queued -= len(chunk)
            self._cond.notify_all()
            return chunk

    def _ensure(self, n: int) -> None:
        while len(self._buf) - self._pos < n:
            chunk = self._next_chunk()
            if not chunk:
                raise tarfile.ReadError("unexpected end of the archive stream")
            if self._pos:
                del self._buf[:self._pos]
                self._pos = 0
            self._buf += chunk

    def take(self, n: int) -> bytes:
        self._ensure(n)
        data = bytes(self._buf[self._pos:self._pos + n])
        self._pos += n
        return data

    def copy_to(self, fd: int, n: int) -> None:
        """Write the next ``n`` bytes to the file descriptor ``fd``."""
        while n > 0:
            if self._pos >= len(self._buf):
                self._buf, self._pos = bytearray(), 0
                self._ensure(1)
            view = memoryview(self._buf)[self._pos:self._pos + n]
            written = 0
            while written < len(view):
                written += os.write(fd, view[written:])
            view.release()
            self._pos += written
            n -= written

    def drain(self) -> None:
        while self._next_chunk():
            pass

    def hexdigest(self) -> str:
        """SHA-256 of the whole stream (after :meth:`drain`)."""
        return self.sha.hexdigest()


def _padded(size: int) -> int:
    return size + (-size % tarfile.BLOCKSIZE)


def _pax_records(data: bytes) -> dict[str, str]:
    """The ``<length> <key>=<value>`` records of a PAX header; tarfile.ReadError when malformed."""
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data) and data[pos:pos + 1] not in (b"", b"\0"):
        space = data.find(b" ", pos, pos + 20)
        digits = data[pos:space] if space > pos else b""
        length = int(digits) if digits.isdigit() else 0
        if length <= space - pos + 1 or pos + length > len(data) or data[pos + length - 1:pos + length] != b"\n":
            raise tarfile.ReadError(f"malformed PAX header record at byte {pos}")
        key, eq, value = data[space + 1:pos + length - 1].partition(b"=")
        if not eq or not key:
            raise tarfile.ReadError(f"malformed PAX header record at byte {pos}")
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records


def _header_data(src: _Source, info: tarfile.TarInfo) -> bytes:
    if not 0 <= info.size <= MAX_HEADER_BYTES:
        raise tarfile.ReadError(f"an extended header of {info.size} bytes (the limit is {MAX_HEADER_BYTES})")
    return src.take(_padded(info.size))[:info.size]


def _members(src: _Source) -> Iterator[tarfile.TarInfo]:
    """The archive's members (ustar, GNU long names and PAX headers); the caller reads each
    member's data before asking for the next."""
    pax: dict[str, str] = {}
    long_name = long_link = None
    while True:
        block = src.take(tarfile.BLOCKSIZE)
        if block == _ZERO_BLOCK:
            return  # the end-of-archive marker
        info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")  # checks the header checksum
        if info.type in (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE):
            records = _pax_records(_header_data(src, info))
            if info.type != tarfile.XGLTYPE:
                pax.update(records)
            continue
        if info.type in (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK):
            text = _header_data(src, info).rstrip(b"\0").decode("utf-8", "surrogateescape")
            if info.type == tarfile.GNUTYPE_LONGNAME:
                long_name = text
            else:
                long_link = text
            continue
        info.name = pax.get("path") or long_name or info.name
        info.linkname = pax.get("linkpath") or long_link or info.linkname
        if "size" in pax:
            if not pax["size"].isdigit():
                raise tarfile.ReadError(f"member {info.name!r}: a PAX size of {pax['size'][:20]!r}")
            info.size = int(pax["size"])
        if not 0 <= info.size <= MAX_CODE_BYTES:
            raise UnsafeArchiveError(f"archive member {info.name!r} is {info.size} bytes; a bundle holds at most "
                                     f"{MAX_CODE_BYTES}")
        pax, long_name, long_link = {}, None, None
        yield info


def extract_stream(stream: IO[bytes], target: str, expected_sha256: str | None = None) -> int:
    """Extract the tar ``stream`` into ``target`` atomically; returns the number of regular files."""
    if os.path.isdir(target):
        while stream.read(CHUNK):
            pass
        return 0
    parent = os.path.dirname(os.path.abspath(target)) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = f"{target}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    src = _Source(stream)
    files = members = total = 0
    links: dict[str, set[str]] = {}
    try:
        os.makedirs(tmp)
        for member in _members(src):
            if member.type == tarfile.GNUTYPE_SPARSE:
                raise UnsafeArchiveError(f"archive member {member.name!r} is a sparse file; not supported")
            members += 1
            total += member.size if member.isfile() else 0
            if files + member.isfile() > MAX_CODE_FILES or members > MAX_MEMBERS or total > MAX_CODE_BYTES:
                raise UnsafeArchiveError(f"the bundle holds more than {MAX_CODE_FILES} files or {MAX_CODE_BYTES} "
                                         f"bytes (at member {member.name!r}): the upload limits apply here too")
            rel = check_member(member, links)
            parts = rel.split("/")
            if any("/".join(parts[:i]) in links for i in range(1, len(parts))):
                raise UnsafeArchiveError(f"archive member {member.name!r} is inside a symbolic link")
            dest = os.path.join(tmp, rel) if rel else tmp
            if member.isdir():
                os.makedirs(dest, exist_ok=True)
                src.take(_padded(member.size))
                continue
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            if os.path.lexists(dest):
                raise UnsafeArchiveError(f"archive member {member.name!r} appears twice")
            if member.issym():
                os.symlink(member.linkname, dest)
                continue
            fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o755 if member.mode & 0o111 else 0o644)
            try:
                src.copy_to(fd, member.size)
            finally:
                os.close(fd)
            src.take(_padded(member.size) - member.size)
            files += 1
        src.drain()  # hash what follows the end-of-archive marker too
        if expected_sha256 and src.hexdigest() != expected_sha256:
            raise UnsafeArchiveError(f"bundle checksum mismatch: expected {expected_sha256}, "
                                     f"got {src.hexdigest()} (transfer corrupted or archive altered)")
        try:
            os.rename(tmp, target)
        except OSError:
            if not os.path.isdir(target):  # lost a race with an identical upload: fine
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return files


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print("usage: unpack <target dir> [<sha256>]  (tar stream on stdin)", file=sys.stderr)
        return 2
    # stdin's unbuffered file: a refusal exits while the read-ahead thread still waits in a read, and
    # the interpreter's shutdown would then block on (and abort for) sys.stdin's buffer lock
    stdin = open(0, "rb", buffering=0, closefd=False)  # noqa: SIM115 -- lives as long as the process
    try:
        files = extract_stream(stdin, argv[0], argv[1] if len(argv) == 2 else None)
    except (UnsafeArchiveError, tarfile.TarError) as exc:
        print(f"trialflow unpack: refused: {exc}", file=sys.stderr)
        return 3
    print(files)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
