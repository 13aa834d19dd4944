"""Experiments on disk: creating, finding and opening them (no Prefect imports here, so the CLI's
read-only commands stay fast)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import make_url

from .config import ExperimentConfig, load_config, parse_config
from .config.experiment import DEFAULT_WORKING_DIRECTORY
from .ids import new_experiment_id
from .store import DB_RELATIVE_PATH, ExperimentRecord, ExperimentStore

STORE_URL_FILE = Path("db") / "store-url"  # where a shared store is: its URL, without the password

# Configs of experiments created in this process (the Python API): they keep their secrets, which
# the stored copy masks.
LIVE_CONFIGS: dict[str, ExperimentConfig] = {}


class ExperimentNotFound(LookupError):
    """No experiment with that id under the working directory."""


def default_root() -> Path:
    return Path(os.path.expanduser(os.environ.get("TRIALFLOW_HOME", DEFAULT_WORKING_DIRECTORY)))


def create_experiment(config: ExperimentConfig, config_path: str | None = None) -> tuple[str, Path]:
    """A new experiment id and its directory with the store holding the config. With ``storeUrl`` the
    records go to that database and the directory keeps where (the URL without its password)."""
    root = Path(config.experiment_working_directory)
    experiment_id = new_experiment_id()
    exp_dir = root / experiment_id
    (exp_dir / "log").mkdir(parents=True, exist_ok=True)
    LIVE_CONFIGS[experiment_id] = config
    if config.store_url is not None:
        url = config.store_url.get_secret_value()
        (exp_dir / STORE_URL_FILE).parent.mkdir(parents=True, exist_ok=True)
        (exp_dir / STORE_URL_FILE).write_text(_without_password(url) + "\n", encoding="utf-8")
        store = ExperimentStore(url, experiment_id)
    else:
        store = ExperimentStore.embedded(exp_dir, experiment_id)
    try:
        store.create_experiment(config.experiment_name, config.dump(), config_path)
    finally:
        store.close()
    _register(experiment_id, root)
    return experiment_id, exp_dir


def _registry() -> Path:
    return default_root() / ".registry.jsonl"


def _register(experiment_id: str, root: Path) -> None:
    """Remember where an experiment outside the default root lives (like nnictl's .experiment)."""
    if root.resolve() == default_root().resolve():
        return
    _registry().parent.mkdir(parents=True, exist_ok=True)
    with open(_registry(), "a", encoding="utf-8") as f:
        f.write(json.dumps({"id": experiment_id, "root": str(root)}) + "\n")


def _registered_roots() -> list[Path]:
    roots: list[Path] = []
    try:
        lines = _registry().read_text(encoding="utf-8").splitlines()
    except OSError:
        return roots
    for line in lines:
        try:
            root = Path(json.loads(line)["root"])
        except (ValueError, KeyError, TypeError):
            continue
        if root not in roots:
            roots.append(root)
    return roots


def _without_password(url: str) -> str:
    return make_url(url).set(password=None).render_as_string(hide_password=False)


def _has_store(exp_dir: Path) -> bool:
    return (exp_dir / DB_RELATIVE_PATH).is_file() or (exp_dir / STORE_URL_FILE).is_file()


def open_store(working_directory: str | os.PathLike[str], experiment_id: str) -> ExperimentStore:
    """The experiment's store: embedded in its directory, or the shared database its directory names
    (the password from the experiment's config in this process, else PGPASSWORD or ~/.pgpass)."""
    exp_dir = Path(working_directory) / experiment_id
    if (exp_dir / DB_RELATIVE_PATH).is_file():
        return ExperimentStore.embedded(exp_dir, experiment_id)
    if (exp_dir / STORE_URL_FILE).is_file():
        live = LIVE_CONFIGS.get(experiment_id)
        if live is not None and live.store_url is not None:
            return ExperimentStore(live.store_url.get_secret_value(), experiment_id)
        return ExperimentStore((exp_dir / STORE_URL_FILE).read_text(encoding="utf-8").strip(), experiment_id)
    raise ExperimentNotFound(f"no experiment {experiment_id!r} under {working_directory}; "
                             "`trialflow experiment list` shows the known ones")


def load_experiment_config(store: ExperimentStore, config_path: str | None = None) -> ExperimentConfig:
    """The experiment's config: in-process original, else the config file, else the stored copy."""
    live = LIVE_CONFIGS.get(store.experiment_id)
    if live is not None:
        return live
    record = store.experiment()
    path = config_path or record.config_path
    if path and Path(path).is_file():
        return load_config(path)
    return stored_config(store)


def stored_config(store: ExperimentStore) -> ExperimentConfig:
    """The config stored with the experiment, parsed. Copies stored before the search space's file
    was dropped from them hold both ``searchSpace`` and ``searchSpaceFile``: the content wins."""
    data = dict(store.experiment().config)
    if data.get("searchSpace") is not None:
        data.pop("searchSpaceFile", None)
    return parse_config(data, source=f"stored config of {store.experiment_id}")


@dataclass
class ExperimentEntry:
    id: str
    root: Path
    record: ExperimentRecord


def search_roots(root: Path | None = None) -> list[Path]:
    return [root] if root is not None else [default_root(), *_registered_roots()]


def find_experiment(experiment_id: str, root: Path | None = None) -> tuple[Path, ExperimentStore]:
    """The working directory and store of an experiment (default root, then registered roots)."""
    for base in search_roots(root):
        if _has_store(base / experiment_id):
            return base, open_store(base, experiment_id)
    raise ExperimentNotFound(f"no experiment {experiment_id!r} found; `trialflow experiment list` shows the "
                             "known ones (use --root for another working directory)")


def list_experiments(root: Path | None = None) -> list[ExperimentEntry]:
    out: list[ExperimentEntry] = []
    for base in search_roots(root):
        if not base.is_dir():
            continue
        for exp_dir in sorted(d for d in base.iterdir() if _has_store(d)):
            exp_id = exp_dir.name
            if any(e.id == exp_id for e in out):
                continue
            store = open_store(base, exp_id)
            try:
                out.append(ExperimentEntry(exp_id, base, store.experiment()))
            except KeyError:
                continue
            finally:
                store.close()
    return out
