"""The trial code directory as an upload bundle: ``.nniignore``, NNI's limits, a deterministic archive.

:func:`scan_code_dir` walks ``trialCodeDirectory`` honouring ``.nniignore`` files at any depth
(gitignore syntax through pathspec; a deeper file overrides a shallower one, ``!`` re-includes),
refuses symbolic links that leave the directory, leaves out the running experiment's config file,
files holding its secrets and trialflow's own folders (:mod:`trialflow.foundation.withheld`), and
enforces NNI's limits of 2000 files and 300 MB with an error listing the biggest offenders and the
``.nniignore`` lines that fix it.

A :class:`CodeBundle` streams itself as an uncompressed tar whose bytes depend only on the
relative paths, contents, executable bits and link targets (sorted entries, zero mtimes/owners),
so its SHA-256 is a content key: a service uploads a given key to a machine or storage once.
Workers extract it with :mod:`trialflow.trial.unpack`, which re-checks the key.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pathspec

from ..foundation.user_errors import UserError
from ..foundation.withheld import is_withheld, is_withheld_folder
from ..trial.protocol import MAX_CODE_BYTES, MAX_CODE_FILES

MAX_FILES = MAX_CODE_FILES
MAX_BYTES = MAX_CODE_BYTES
IGNORE_FILE = ".nniignore"
CHUNK = 1 << 20
_SCAN_CAP = 20  # keep counting up to 20x the file limit to report how far over it is


class CodeDirError(UserError, ValueError):
    """The code directory cannot be bundled; the message names the problem and the fix."""


@dataclass(frozen=True)
class BundleEntry:
    rel: str  # posix path relative to the code directory
    path: str  # absolute path on this machine
    kind: str  # "file", "dir" or "link"
    size: int = 0
    executable: bool = False
    link: str = ""
    mtime_ns: int = 0


def _mb(n: int) -> str:
    return f"{n / 1024 / 1024:.1f} MB"


class _Ignore:
    """Stack of (.nniignore base, spec); the deepest file with a matching pattern decides."""

    def __init__(self) -> None:
        self.specs: list[tuple[str, pathspec.GitIgnoreSpec]] = []

    def push(self, base: str, directory: str) -> bool:
        path = os.path.join(directory, IGNORE_FILE)
        if not os.path.isfile(path):
            return False
        with open(path, encoding="utf-8", errors="replace") as f:
            self.specs.append((base, pathspec.GitIgnoreSpec.from_lines(f.read().splitlines())))
        return True

    def ignored(self, rel: str, is_dir: bool) -> bool:
        for base, spec in reversed(self.specs):
            sub = rel[len(base) + 1:] if base else rel
            result = spec.check_file(sub + "/" if is_dir else sub).include
            if result is not None:
                return bool(result)
        return False


def scan_code_dir(code_dir: Path | str, max_files: int = MAX_FILES, max_bytes: int = MAX_BYTES) -> CodeBundle:
    """Walk the code directory into a bundle; raises CodeDirError with the fix when it cannot be one."""
    root = os.path.realpath(os.fspath(code_dir))
    if not os.path.isdir(root):
        raise CodeDirError(f"trialCodeDirectory {code_dir} is not a directory")
    entries: list[BundleEntry] = []
    ignore = _Ignore()
    files = 0

    def walk(directory: str, rel_dir: str) -> None:
        nonlocal files
        pushed = ignore.push(rel_dir, directory)
        try:
            with os.scandir(directory) as it:
                children = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            raise CodeDirError(f"cannot read {directory}: {exc.strerror}") from None
        for child in children:
            rel = f"{rel_dir}/{child.name}" if rel_dir else child.name
            st = child.stat(follow_symlinks=False)
            is_dir = stat.S_ISDIR(st.st_mode)
            if ignore.ignored(rel, is_dir):
                continue
            if stat.S_ISLNK(st.st_mode):
                entries.append(_link_entry(root, child.path, rel))
                files += 1
            elif is_dir:
                if is_withheld_folder(child.path):
                    continue
                entries.append(BundleEntry(rel, child.path, "dir"))
                walk(child.path, rel)
            elif stat.S_ISREG(st.st_mode):
                if is_withheld(child.path, st.st_size):
                    continue
                entries.append(BundleEntry(rel, child.path, "file", st.st_size, bool(st.st_mode & 0o111),
                                           mtime_ns=st.st_mtime_ns))
                files += 1
            if files > max_files * _SCAN_CAP:
                return
        if pushed:
            ignore.specs.pop()

    walk(root, "")
    bundle = CodeBundle(Path(root), entries)
    _check_limits(bundle, max_files, max_bytes)
    return bundle


def _link_entry(root: str, path: str, rel: str) -> BundleEntry:
    target = os.readlink(path)
    resolved = os.path.realpath(path)
    if os.path.commonpath([root, resolved]) != root:
        raise CodeDirError(f"symbolic link {rel} -> {target} in the code directory {root} points outside it, "
                           f"so trials on other machines could not see its target. Copy the target into the "
                           f"directory, or exclude the link by adding '{rel}' to {root}/{IGNORE_FILE}")
    relative = os.path.relpath(resolved, os.path.dirname(os.path.join(root, rel)))
    return BundleEntry(rel, path, "link", link=relative.replace(os.sep, "/"))


def _top(rel: str) -> str:
    return rel.split("/", 1)[0] + ("/" if "/" in rel else "")


def _check_limits(bundle: CodeBundle, max_files: int, max_bytes: int) -> None:
    root = bundle.root
    files = [e for e in bundle.entries if e.kind != "dir"]
    if len(files) > max_files:
        counts: dict[str, int] = {}
        for e in files:
            counts[_top(e.rel)] = counts.get(_top(e.rel), 0) + 1
        worst = sorted(counts.items(), key=lambda kv: -kv[1])[:5]
        over = f"{len(files)}" if len(files) <= max_files * _SCAN_CAP else f"more than {max_files * _SCAN_CAP}"
        raise CodeDirError(
            f"code directory {root} has {over} files; the limit is {max_files}. Where they are: "
            + ", ".join(f"{name} ({n} files)" for name, n in worst)
            + f". Exclude what trials do not need in {root}/{IGNORE_FILE} (gitignore syntax), e.g.:\n"
            + "\n".join(f"  {name}" for name, _ in worst if name.endswith("/")))
    total = sum(e.size for e in files)
    if total > max_bytes:
        largest = sorted(files, key=lambda e: -e.size)[:5]
        raise CodeDirError(
            f"code directory {root} is {_mb(total)}; the limit is {_mb(max_bytes)}. Largest files: "
            + ", ".join(f"{e.rel} ({_mb(e.size)})" for e in largest)
            + f". Keep data and checkpoints out of the code directory: exclude them in {root}/{IGNORE_FILE} "
            "(gitignore syntax), e.g.:\n" + "\n".join(f"  {e.rel}" for e in largest))


@dataclass
class CodeBundle:
    """A scanned code directory; :meth:`stream` writes its deterministic tar archive."""

    root: Path
    entries: list[BundleEntry]

    @property
    def file_count(self) -> int:
        return sum(1 for e in self.entries if e.kind != "dir")

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries)

    def fingerprint(self) -> str:
        """Key of what the directory looks like (paths, sizes, mtimes), without reading contents."""
        manifest = [(e.rel, e.kind, e.size, e.executable, e.link, e.mtime_ns) for e in self.entries]
        return hashlib.sha256(json.dumps(manifest).encode()).hexdigest()

    def content_hash(self, cache_file: Path | None = None) -> str:
        """SHA-256 of the archive; remembered in ``cache_file`` by fingerprint, so an unchanged
        directory is hashed once."""
        key = self.fingerprint()
        cache: dict[str, str] = {}
        if cache_file is not None:
            try:
                cache = json.loads(cache_file.read_text())
            except (OSError, ValueError):
                cache = {}
            if isinstance(cache.get(key), str):
                return cache[key]
        digest = self.stream(lambda _chunk: None)
        if cache_file is not None:
            cache = dict(list(cache.items())[-255:])
            cache[key] = digest
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache_file.with_name(f"{cache_file.name}.{os.getpid()}")
            tmp.write_text(json.dumps(cache))
            os.replace(tmp, cache_file)
        return digest

    def stream(self, sink: Callable[[bytes], object]) -> str:
        """Write the tar archive to ``sink`` in chunks of about 1 MB; returns its SHA-256."""
        sha = hashlib.sha256()
        buf = bytearray()

        def emit(data: bytes) -> None:
            sha.update(data)
            sink(data)

        for entry in self.entries:
            buf += _header(entry)
            if entry.kind == "file":
                remaining = entry.size
                with open(entry.path, "rb", buffering=0) as f:
                    while remaining > 0:
                        chunk = f.read(min(CHUNK, remaining))
                        if not chunk:
                            raise CodeDirError(f"{entry.rel} shrank while being uploaded; retry when it is stable")
                        remaining -= len(chunk)
                        if len(buf) + len(chunk) > CHUNK:
                            if buf:
                                emit(bytes(buf))
                                buf.clear()
                            emit(chunk)
                        else:
                            buf += chunk
                buf += b"\0" * (-entry.size % tarfile.BLOCKSIZE)
            if len(buf) >= CHUNK:
                emit(bytes(buf))
                buf.clear()
        buf += b"\0" * (2 * tarfile.BLOCKSIZE)
        emit(bytes(buf))
        return sha.hexdigest()


def _header(entry: BundleEntry) -> bytes:
    info = tarfile.TarInfo(entry.rel)
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if entry.kind == "dir":
        info.type, info.mode = tarfile.DIRTYPE, 0o755
    elif entry.kind == "link":
        info.type, info.mode, info.linkname = tarfile.SYMTYPE, 0o777, entry.link
    else:
        info.size, info.mode = entry.size, 0o755 if entry.executable else 0o644
    return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape")
