"""``trialflow experiment save`` / ``load`` (NNI's nnictl experiment save/load): one experiment -- its
store, trial folders and logs, and optionally its code -- as one ``.tar.gz`` that another machine (or
another folder) loads and can view, export, resume.

Archive layout: ``manifest.json`` ({"id", "directory", "codeDirectory"}), ``experiment/`` (the
experiment folder), ``code/`` (with ``--saveCodeDir``). Loading extracts with tarfile's ``data``
filter (no absolute paths, no ``..``, no links leaving the target, no devices), then rewrites the
stored paths (trial folders, code and working directory) to where the experiment now lives.
"""

from __future__ import annotations

import json
import shutil
import tarfile
import tempfile
from pathlib import Path

from .experiments import open_store, register_root
from .store import ExperimentStore
from .user_errors import UserError

MANIFEST = "manifest.json"


class ArchiveError(UserError, ValueError):
    """A package that cannot be saved or loaded; the message says why and what to do."""


def package_name(experiment_id: str) -> str:
    return f"trialflow_experiment_{experiment_id}.tar.gz"


def save_experiment(store: ExperimentStore, experiment_dir: Path, folder: Path, with_code: bool) -> Path:
    """Write the experiment's package into ``folder``; returns its path. Raises :class:`ArchiveError`
    for a shared (database) store: its records are not in the folder."""
    record = store.experiment()
    if not store.url.startswith("sqlite"):
        raise ArchiveError(f"experiment {record.id} keeps its records in a shared database, not in its folder; "
                           "save works on experiments with the embedded store")
    code = Path(str(record.config.get("trialCodeDirectory") or "."))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / package_name(record.id)
    manifest = {"id": record.id, "directory": str(experiment_dir), "codeDirectory": str(code)}
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
        with tarfile.open(path, "w:gz") as tar:
            tar.add(Path(tmp) / MANIFEST, MANIFEST)
            tar.add(experiment_dir, "experiment")
            if with_code:
                if not code.is_dir():
                    raise ArchiveError(f"the code directory {code} is gone; save without --saveCodeDir")
                tar.add(code, "code")
    return path


def load_experiment(package: Path, code_dir: Path, root: Path, search_space_file: Path | None = None) -> str:
    """Unpack ``package`` as an experiment under ``root`` whose trial code is ``code_dir`` (filled from
    the package when it holds the code); returns the experiment id. Raises :class:`ArchiveError` when
    the package is not one, is unsafe, or the experiment is already there."""
    root, code_dir = root.resolve(), code_dir.resolve()
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        try:
            with tarfile.open(package, "r:gz") as tar:
                tar.extractall(tmp, filter="data")
            manifest = json.loads((Path(tmp) / MANIFEST).read_text(encoding="utf-8"))
            experiment_id, old_dir = str(manifest["id"]), str(manifest["directory"])
        except (OSError, tarfile.TarError, ValueError, KeyError) as exc:
            raise ArchiveError(f"{package} is not a trialflow experiment package ({exc})") from None
        target = root / experiment_id
        if target.exists():
            raise ArchiveError(f"experiment {experiment_id} is already in {root}; delete it first or load "
                               "into another folder (--logDir)")
        if (Path(tmp) / "code").is_dir():
            if code_dir.exists() and any(code_dir.iterdir()):
                raise ArchiveError(f"{code_dir} is not empty; give an empty or new folder as --codeDir")
            code_dir.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(Path(tmp) / "code", code_dir, dirs_exist_ok=True)
        elif not code_dir.is_dir():
            raise ArchiveError(f"the package holds no code and {code_dir} is not a folder: give the trial code's "
                               "folder as --codeDir")
        shutil.move(Path(tmp) / "experiment", target)
    store = open_store(root, experiment_id)
    try:
        config = store.experiment().config
        config.update(trialCodeDirectory=str(code_dir), experimentWorkingDirectory=str(root))
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
