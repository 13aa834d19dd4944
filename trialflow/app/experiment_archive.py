"""``trialflow experiment save`` / ``load`` (NNI's nnictl experiment save/load): one experiment -- its
store, trial folders and logs, and optionally its code -- as one ``.tar.gz`` that another machine (or
another folder) loads and can view, export, resume.

Archive layout: ``manifest.json`` ({"id", "directory", "codeDirectories"}), ``experiment/`` (the
experiment folder), ``code/`` (with ``--saveCodeDir``: the first code folder; ``code-1/``, ... those of
further hybrid sections). Loading extracts with tarfile's ``data``
filter (no absolute paths, no ``..``, no links leaving the target, no devices), then rewrites the
stored paths (trial folders, code and working directory) to where the experiment now lives.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from ..experiments import default_root, has_store, open_store, register_root, search_roots, stored_config
from ..foundation.ids import looks_like_experiment_id
from ..foundation.user_errors import UserError
from ..foundation.withheld import withhold, withhold_folders
from ..records.codebundle import scan_code_dir
from ..records.store import DB_RELATIVE_PATH, ExperimentStore

MANIFEST = "manifest.json"
MANIFEST_LIMIT = 1 << 20  # bytes of the manifest read (it is a few hundred)


class ArchiveError(UserError, ValueError):
    """A package that cannot be saved or loaded; the message says why and what to do."""


def package_name(experiment_id: str) -> str:
    return f"trialflow_experiment_{experiment_id}.tar.gz"


def save_experiment(store: ExperimentStore, experiment_dir: Path, folder: Path, with_code: bool,
                    force: bool = False) -> Path:
    """Write the experiment's package into ``folder``; returns its path. With ``with_code``, the code
    folder of each training-service section (the experiment's own, wherever the command runs), as its
    trials get it: ``.nniignore`` honoured, the config file, files holding its secrets and trialflow's own
    folders left out, the upload limits held. The package appears whole or not at all. Raises
    :class:`ArchiveError` for a shared (database) store (its records are not in the folder), a package
    already there without ``force`` or a code folder that is gone;
    :class:`~trialflow.records.codebundle.CodeDirError` for one over the limits."""
    record = store.experiment()
    if not store.url.startswith("sqlite"):
        raise ArchiveError(f"experiment {record.id} keeps its records in a shared database, not in its folder; "
                           "save works on experiments with the embedded store")
    path = folder / package_name(record.id)
    if path.exists() and not force:
        raise ArchiveError(f"{path} already exists; give --force to replace it, or another folder (--path)")
    codes = code_directories(record.config)
    bundles = []
    if with_code:
        withhold(stored_config(store), record.config_path)
        withhold_folders(experiment_dir.parent, default_root())
        for code in codes:
            if not Path(code).is_dir():
                raise ArchiveError(f"the code directory {code} is gone; save without --saveCodeDir")
            bundles.append(scan_code_dir(code))
    manifest = {"id": record.id, "directory": str(experiment_dir), "codeDirectories": codes}
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        (Path(tmp) / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
        partial = Path(tmp) / path.name
        with tarfile.open(partial, "w:gz") as tar:
            tar.add(Path(tmp) / MANIFEST, MANIFEST)
            tar.add(experiment_dir, "experiment")
            for i, bundle in enumerate(bundles):
                for entry in bundle.entries:
                    tar.add(entry.path, f"{_code_member(i)}/{entry.rel}", recursive=False)
        os.replace(partial, path)
    return path


def code_directories(config: dict[str, Any]) -> list[str]:
    """The distinct trial code folders of a stored config, in section order (each section holds its
    own: NNI's top-level shortcut is copied into every section that does not set it)."""
    sections = config.get("trainingService")
    listed = sections if isinstance(sections, list) else [sections or {}]
    found = [s.get("trialCodeDirectory") for s in listed if isinstance(s, dict)]
    return list(dict.fromkeys(str(c) for c in [*found, config.get("trialCodeDirectory")] if c))


def _code_member(index: int) -> str:
    """The package's folder for code folder ``index``: ``code`` (the only one of most experiments)."""
    return "code" if index == 0 else f"code-{index}"


def _repointed(config: dict[str, Any], moved: dict[str, str]) -> dict[str, Any]:
    """``config`` with every code folder path (top level and each section) replaced per ``moved``."""
    def repoint(section: dict[str, Any]) -> dict[str, Any]:
        code = section.get("trialCodeDirectory")
        return {**section, "trialCodeDirectory": moved[str(code)]} if code is not None else section

    out = repoint(config)
    sections = config.get("trainingService")
    if isinstance(sections, list):
        out["trainingService"] = [repoint(s) for s in sections]
    elif isinstance(sections, dict):
        out["trainingService"] = repoint(sections)
    return out


def load_experiment(package: Path, code_dir: Path, root: Path, search_space_file: Path | None = None) -> str:
    """Unpack ``package`` as an experiment under ``root`` whose trial code is ``code_dir`` (filled from
    the package when it holds the code); returns the experiment id. Nothing is written before the
    package is checked: its manifest names an experiment id (never a path) that no known working
    directory holds yet, and it fits in the free space under ``root``; once unpacked (in a temporary
    folder under ``root``), the store inside must hold that experiment. Raises :class:`ArchiveError`
    when the package is not one, is unsafe, or the experiment is already there; nothing is left."""
    root, code_dir = root.resolve(), code_dir.resolve()
    experiment_id, size = _checked_package(package)
    taken = [base for base in [root, *search_roots()] if has_store(base / experiment_id)]
    if taken:
        raise ArchiveError(f"experiment {experiment_id} is already in {taken[0]}; delete it first "
                           "(`trialflow experiment delete`) or keep the one there")
    free = shutil.disk_usage(_existing_ancestor(root)).free
    if size > free:
        raise ArchiveError(f"no space left on {root} for {package}: it unpacks to {_mib(size)}, {_mib(free)} "
                           "are free; free space or load into another folder (--logDir)")
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        try:
            with tarfile.open(package, "r:gz") as tar:
                tar.extractall(tmp, filter="data")
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise ArchiveError(f"no space left on {root} while unpacking {package}: free space or load into "
                                   "another folder (--logDir)") from None
            raise ArchiveError(f"{package} could not be unpacked ({exc})") from None
        except tarfile.TarError as exc:
            raise ArchiveError(f"{package} is not a trialflow experiment package ({exc})") from None
        old_dir = _stored_experiment(Path(tmp), experiment_id, package)
        moved = _place_code(Path(tmp), code_dir)
        target = root / experiment_id
        shutil.move(Path(tmp) / "experiment", target)
    store = open_store(root, experiment_id)
    try:
        stored = store.experiment().config
        olds = code_directories(stored)
        config = _repointed(stored, {old: moved[min(i, len(moved) - 1)] for i, old in enumerate(olds)})
        config["experimentWorkingDirectory"] = str(root)
        if search_space_file is not None:
            config["searchSpace"] = json.loads(search_space_file.read_text(encoding="utf-8"))
            config.pop("searchSpaceFile", None)
        # detached from the file it was created from: it runs with its stored config from now on
        store.set_experiment(config=json.dumps(config), config_path=None, controller_pid=None)
        store.relocate(old_dir, str(target))
    finally:
        store.close()
    register_root(experiment_id, root)
    return experiment_id


def _place_code(unpacked: Path, code_dir: Path) -> list[str]:
    """Copy the package's code folders to ``code_dir`` (the first) and ``code_dir-1``, ``code_dir-2``,
    ... beside it (those of further sections); returns where each went. A package without code
    leaves every section's code at ``code_dir``, which must then be a folder."""
    held: list[Path] = []
    while (unpacked / _code_member(len(held))).is_dir():
        held.append(unpacked / _code_member(len(held)))
    if not held:
        if not code_dir.is_dir():
            raise ArchiveError(f"the package holds no code and {code_dir} is not a folder: give the trial code's "
                               "folder as --codeDir")
        return [str(code_dir)]
    places = [code_dir if i == 0 else code_dir.with_name(f"{code_dir.name}-{i}") for i in range(len(held))]
    for place in places:
        if place.exists() and any(place.iterdir()):
            raise ArchiveError(f"{place} is not empty; give an empty or new folder as --codeDir")
    for source, place in zip(held, places, strict=True):
        place.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(source, place, dirs_exist_ok=True)
    return [str(p) for p in places]


def _checked_package(package: Path) -> tuple[str, int]:
    """(the experiment id its manifest names, its unpacked size in bytes), read without unpacking.
    Raises :class:`ArchiveError` when it is no package or its id is not an experiment id."""
    try:
        with tarfile.open(package, "r:gz") as tar:
            members = tar.getmembers()
            manifest_file = tar.extractfile(MANIFEST)
            if manifest_file is None:
                raise KeyError(MANIFEST)
            manifest = json.loads(manifest_file.read(MANIFEST_LIMIT))
        experiment_id = manifest["id"]
        str(manifest["directory"])
    except (OSError, tarfile.TarError, ValueError, KeyError, TypeError) as exc:
        raise ArchiveError(f"{package} is not a trialflow experiment package ({exc!r})") from None
    if not isinstance(experiment_id, str) or not looks_like_experiment_id(experiment_id):
        raise ArchiveError(f"{package} names {str(experiment_id)[:40]!r} as its experiment, which is no experiment "
                           "id (8 lowercase letters and digits): it was not written by `experiment save`")
    return experiment_id, sum(m.size for m in members if m.isfile())


def _stored_experiment(unpacked: Path, experiment_id: str, package: Path) -> str:
    """The folder the experiment was saved from, once the unpacked store is seen to hold
    ``experiment_id``. Raises :class:`ArchiveError` otherwise (a manifest that lies)."""
    if not (unpacked / "experiment" / DB_RELATIVE_PATH).is_file():
        raise ArchiveError(f"{package} holds no experiment store: it was not written by `experiment save`")
    try:
        store = ExperimentStore.embedded(unpacked / "experiment", experiment_id)
    except UserError:
        raise ArchiveError(f"{package} holds a store that cannot be read: it is damaged or was not written by "
                           "`experiment save`") from None
    try:
        store.experiment()
    except (KeyError, UserError):
        raise ArchiveError(f"{package} names experiment {experiment_id}, but its store does not hold it: it was "
                           "not written by `experiment save`") from None
    finally:
        store.close()
    return str(json.loads((unpacked / MANIFEST).read_text(encoding="utf-8"))["directory"])


def _existing_ancestor(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"
