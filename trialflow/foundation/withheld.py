"""Files no code bundle of this process carries: the experiment's config file, any file holding
one of its secrets, and trialflow's own folders.

A config often sits in ``trialCodeDirectory`` (the quickstart's own layout) and may hold passwords,
passphrases and tokens inline. Bundles go to remote machines, shared storage and Slurm clusters,
where other users may read them; so before an experiment uploads its code, :func:`withhold` names its
config file and the values of its secret fields, and :func:`scan_code_dir
<trialflow.records.codebundle.scan_code_dir>` leaves out that file and every file whose bytes contain one of
those values (values shorter than :data:`MIN_SECRET_BYTES` are too common to look for: the config
file itself is still left out by its path). A code directory may also hold trialflow's own folders (the
experiments folder, with the records, a platform's default shared storage and the kept Prefect
server's auth string), named by :func:`withhold_folders`, or the folder where the config mounts a
share (other experiments' and other users' files, and the bundles themselves), named by
:func:`withhold`: the walk leaves each such folder out whole.

Lifecycle: what is withheld stays withheld for the life of the process (a notebook that runs several
experiments keeps all of their secrets out of every bundle); each left-out file is logged once.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, SecretStr

log = logging.getLogger("trialflow.experiment")

MIN_SECRET_BYTES = 6
READ_CHUNK = 1 << 20

_lock = threading.Lock()
_files: set[str] = set()  # real paths
_folders: dict[str, str] = {}  # real path -> why it stays out
_secrets: set[bytes] = set()
_announced: set[str] = set()


def _values(value: Any) -> Iterable[Any]:
    """``value`` and every value inside it (a config's models, lists and mappings, at any depth)."""
    stack = [value]
    while stack:
        item = stack.pop()
        yield item
        if isinstance(item, BaseModel):
            stack.extend(getattr(item, field) for field in type(item).model_fields)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)


def secret_values(value: Any) -> list[str]:
    """Every :class:`SecretStr` value inside a config (models, lists and mappings, at any depth), with
    the password of a URL-shaped one (a store URL) on its own as well."""
    found: list[str] = []
    for item in _values(value):
        if isinstance(item, SecretStr):
            text = item.get_secret_value()
            found.append(text)
            try:
                password = urlsplit(text).password
            except ValueError:
                password = None
            if password:
                found.append(password)
    return found


def local_mount_points(config: BaseModel) -> list[str]:
    """The folders where a config's shares are mounted on this machine (``localMountPoint`` of its
    shared storage and of a platform's storage): trial files of this and other experiments, other
    users' files, and the code bundles themselves."""
    return [str(point) for item in _values(config)
            if isinstance(item, BaseModel) and (point := getattr(item, "local_mount_point", None)) is not None]


def withhold(config: BaseModel, config_path: str | os.PathLike[str] | None) -> None:
    """Keep ``config_path`` (the file the experiment runs from), files holding ``config``'s secrets and
    the folders its shares are mounted at out of every bundle this process makes from now on."""
    values = {v.encode() for v in secret_values(config) if len(v.encode()) >= MIN_SECRET_BYTES}
    with _lock:
        if config_path is not None:
            _files.add(os.path.realpath(config_path))
        _secrets.update(values)
        _folders.update((os.path.realpath(path), "it is where the experiment's shared storage is mounted")
                        for path in local_mount_points(config))


def withhold_folders(*paths: str | os.PathLike[str]) -> None:
    """Keep the folders ``paths`` (trialflow's own) out of every bundle this process makes from now on."""
    with _lock:
        _folders.update((os.path.realpath(path), "it is trialflow's own folder") for path in paths)


def is_withheld_folder(path: str) -> bool:
    """Whether the folder at ``path`` stays out of bundles (one of trialflow's own, or a share's mount
    point); logs the first time it is left out."""
    real = os.path.realpath(path)
    with _lock:
        why = _folders.get(real)
    if why is None:
        return False
    _say_left_out(path, real, why)
    return True


def _say_left_out(path: str, real: str, why: str) -> None:
    """Log that ``path`` (real path ``real``) is left out of the bundles, the first time only."""
    with _lock:
        first = real not in _announced
        _announced.add(real)
    if first:
        log.warning("%s is left out of the code the trials get: %s", path, why)


def is_withheld(path: str, size: int) -> bool:
    """Whether the regular file at ``path`` (``size`` bytes) stays out of bundles; logs the first time
    a file is left out. A file that cannot be read is not withheld here (the bundle reports it)."""
    with _lock:
        files, secrets = set(_files), tuple(_secrets)
    real = os.path.realpath(path)
    why = None
    if real in files:
        why = "it is the experiment's config file"
    elif secrets and size >= MIN_SECRET_BYTES and _holds_any(path, secrets):
        why = "it holds one of the experiment's secrets"
    if why is None:
        return False
    _say_left_out(path, real, why)
    return True


def _holds_any(path: str, secrets: Iterable[bytes]) -> bool:
    wanted = tuple(secrets)
    overlap = max(len(s) for s in wanted) - 1
    tail = b""
    try:
        with open(path, "rb") as f:
            while chunk := f.read(READ_CHUNK):
                window = tail + chunk
                if any(s in window for s in wanted):
                    return True
                tail = window[-overlap:] if overlap else b""
    except OSError:
        return False
    return False
