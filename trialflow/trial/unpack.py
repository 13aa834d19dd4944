"""Safe extraction of a code bundle on a worker (standard library only).

``python -S -m trialflow.trial.unpack <target dir> [<sha256>]`` reads a tar stream on stdin and
extracts it into ``<target dir>`` atomically: members go to a temporary sibling directory that is
renamed to the target only when the whole stream was valid (and, when given, its SHA-256 matches),
so a half-sent or tampered bundle never becomes visible. Refused, with the member named: absolute
paths, ``..`` components, links whose target leaves the bundle, hard links, devices and FIFOs.
A target that already exists is left alone (bundles are keyed by content, so it is the same).
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import shutil
import sys
import tarfile
from typing import IO

CHUNK = 1 << 20


class UnsafeArchiveError(ValueError):
    """The archive has a member that would land outside the target or is of a refused kind."""


def check_member(member: tarfile.TarInfo) -> str:
    """The member's normalised relative path; raises UnsafeArchiveError when it is not allowed."""
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
        target = member.linkname
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target))
        if target.startswith("/") or resolved == ".." or resolved.startswith("../"):
            raise UnsafeArchiveError(f"archive member {name!r} links to {target!r}, outside the bundle")
    return rel


def _kind(member: tarfile.TarInfo) -> str:
    if member.islnk():
        return "hard link"
    if member.isdev():
        return "device"
    if member.isfifo():
        return "FIFO"
    return "special file"


class _HashingReader:
    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.sha = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.sha.update(data)
        return data


def extract_stream(stream: IO[bytes], target: str, expected_sha256: str | None = None) -> int:
    """Extract the tar ``stream`` into ``target`` atomically; returns the number of files."""
    if os.path.isdir(target):
        _drain(stream)
        return 0
    parent = os.path.dirname(os.path.abspath(target)) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = f"{target}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    reader = _HashingReader(stream)
    files = 0
    links: set[str] = set()
    try:
        os.makedirs(tmp)
        with tarfile.open(fileobj=reader, mode="r|", bufsize=CHUNK) as tar:  # type: ignore[call-overload]
            for member in tar:
                rel = check_member(member)
                if not rel:
                    continue
                prefix = rel.split("/")
                if any("/".join(prefix[:i]) in links for i in range(1, len(prefix))):
                    raise UnsafeArchiveError(f"archive member {member.name!r} is inside a symbolic link")
                dest = os.path.join(tmp, rel)
                if member.isdir():
                    os.makedirs(dest, exist_ok=True)
                    continue
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                if os.path.lexists(dest):
                    raise UnsafeArchiveError(f"archive member {member.name!r} appears twice")
                if member.issym():
                    os.symlink(member.linkname, dest)
                    links.add(rel)
                    continue
                src = tar.extractfile(member)
                assert src is not None
                with open(dest, "wb") as out:
                    shutil.copyfileobj(src, out, CHUNK)
                os.chmod(dest, 0o755 if member.mode & 0o111 else 0o644)
                files += 1
        _drain(reader)  # hash what follows the end-of-archive marker too
        if expected_sha256 and reader.sha.hexdigest() != expected_sha256:
            raise UnsafeArchiveError(f"bundle checksum mismatch: expected {expected_sha256}, "
                                     f"got {reader.sha.hexdigest()} (transfer corrupted or archive altered)")
        try:
            os.rename(tmp, target)
        except OSError:
            if not os.path.isdir(target):  # lost a race with an identical upload: fine
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return files


def _drain(stream: IO[bytes] | _HashingReader) -> None:
    while stream.read(CHUNK):
        pass


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print("usage: unpack <target dir> [<sha256>]  (tar stream on stdin)", file=sys.stderr)
        return 2
    try:
        files = extract_stream(sys.stdin.buffer, argv[0], argv[1] if len(argv) == 2 else None)
    except (UnsafeArchiveError, tarfile.TarError) as exc:
        print(f"trialflow unpack: refused: {exc}", file=sys.stderr)
        return 3
    print(files)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
