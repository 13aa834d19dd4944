"""Experiments on disk: creating, finding and opening them (no Prefect imports here, so the CLI's
read-only commands stay fast)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import sqlite3
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..foundation.ids import looks_like_experiment_id, new_experiment_id
from ..foundation.status import EXPERIMENT_LIVE
from ..foundation.user_errors import UserError
from ..records.store_reader import EmbeddedReader, RecordSource
from ..records.store_records import (
    DB_RELATIVE_PATH,
    SCHEMA_VERSION,
    Control,
    ExperimentRecord,
    ImportedItem,
    StoreUnreadable,
)
from ..server.kept_server import DEFAULT_WORKING_DIRECTORY

if TYPE_CHECKING:
    from ..config import ExperimentConfig
    from ..records.store import ExperimentStore

# The config models, tuners and assessors are imported where an experiment is made or its config read:
# commands that only read records (trial ls, export, experiment list) start without them.

STORE_URL_FILE = Path("db") / "store-url"  # where a shared store is: its URL, without the password
CONFIG_FILE_NOTE = Path("db") / "config-file"  # the config file the experiment was created from
CONTROLLER_LOG = Path("log") / "experiment.log"  # the controller's log records, as NNI's nnimanager.log
log = logging.getLogger("trialflow.experiment")

# Configs of experiments created in this process (the Python API): they keep their secrets, which
# the stored copy masks. An entry outlives the run (reading a shared store's records afterwards needs
# its password) and goes with the experiment (delete_experiment_folder).
LIVE_CONFIGS: dict[str, ExperimentConfig] = {}


class ExperimentNotFound(UserError, LookupError):
    """No experiment with that id under the working directory."""


class ConfigMismatch(ValueError):
    """A config file given to run a stored experiment describes another experiment."""


def default_root() -> Path:
    return Path(os.path.expanduser(os.environ.get("TRIALFLOW_HOME", DEFAULT_WORKING_DIRECTORY)))


def check_new_experiment(config: ExperimentConfig) -> None:
    """What ``create`` checks before anything is read or written: the tuner and assessor
    (:class:`TunerError`) and the GPUs local trials ask for (:class:`~trialflow.platforms.PlatformError`)."""
    from ..assessors import check_assessor
    from ..tuners import check_tuner

    if config.tuner is not None:
        check_tuner(config.tuner)
    if config.assessor is not None:
        check_assessor(config.assessor)
    for section in config.services:
        if section.platform == "local":
            from ..platforms.local import check_gpus

            check_gpus(section)  # type: ignore[arg-type]


def create_experiment(config: ExperimentConfig, config_path: str | None = None,
                      overridden: Iterable[str] = (), experiment_id: str | None = None,
                      imported: Sequence[tuple[str, list[ImportedItem]]] = ()) -> tuple[str, Path]:
    """A new experiment id (``experiment_id`` when given and free: one chosen beforehand, e.g. to name
    its flow run) and its directory with the store holding the config. ``overridden``: the
    top-level fields a run's overrides set over the config file (noted: the file differing there is no
    edit, :func:`note_changed_fields`). With ``storeUrl`` the
    records go to that database and the directory keeps where (the URL without its password).
    :func:`check_new_experiment` runs first: a refusal leaves nothing. ``imported``: the items a warm
    start gathered, as ``(source, items)``, stored as the experiment's imported data; a config with a
    ``warmStart`` is created through :func:`trialflow.experiments.warm_start.create_warm_started`, which gathers
    them (raises ``ValueError`` when none were given)."""
    from ..records.store import ExperimentStore
    from .results import optimize_mode_of

    check_new_experiment(config)
    if config.warm_start and not imported:
        raise ValueError("a config with warmStart is created by trialflow.experiments.warm_start.create_warm_started")
    root = Path(config.experiment_working_directory).resolve()
    if experiment_id is None or not looks_like_experiment_id(experiment_id) or (root / experiment_id).exists():
        experiment_id = new_experiment_id()
    exp_dir = root / experiment_id
    (exp_dir / "log").mkdir(parents=True, exist_ok=True)
    LIVE_CONFIGS[experiment_id] = config
    config_path = os.path.abspath(config_path) if config_path else None
    dumped = config.dump()
    if config.store_url is not None:
        url = config.store_url.get_secret_value()
        (exp_dir / STORE_URL_FILE).parent.mkdir(parents=True, exist_ok=True)
        _write_private(exp_dir / STORE_URL_FILE, _without_password(url) + "\n")
        if config_path:  # where a later command finds the password when no environment gives it
            _write_private(exp_dir / CONFIG_FILE_NOTE, config_path + "\n")
        store = ExperimentStore(url, experiment_id)
    else:
        store = ExperimentStore.embedded(exp_dir, experiment_id)
    try:
        store.create_experiment(config.experiment_name, dumped, config_path, optimize_mode_of(dumped))
        note_changed_fields(store, overridden)
        for source, items in imported:
            store.add_imported(items, source)
    finally:
        store.close()
    register_root(experiment_id, root)
    return experiment_id, exp_dir


def _registry() -> Path:
    return default_root() / ".registry.jsonl"


def register_root(experiment_id: str, root: Path) -> None:
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
    from sqlalchemy.engine import make_url

    # URL.set(password=None) keeps the password: None means "unchanged" there
    return make_url(url)._replace(password=None).render_as_string(hide_password=False)


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to a file only its owner can read (0600 from the start)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(path, 0o600)


def has_store(exp_dir: Path) -> bool:
    """Whether an experiment folder holds a store (embedded, or the address of a shared one)."""
    return (exp_dir / DB_RELATIVE_PATH).is_file() or (exp_dir / STORE_URL_FILE).is_file()


def delete_experiment_folder(working_directory: Path, experiment_id: str) -> Path:
    """Delete the experiment's folder (trials, logs, embedded store) and this process's copy of its
    config; returns the folder. The caller makes sure no controller runs it. Raises OSError."""
    folder = Path(working_directory) / experiment_id
    shutil.rmtree(folder)
    LIVE_CONFIGS.pop(experiment_id, None)
    return folder


def open_store(working_directory: str | os.PathLike[str], experiment_id: str,
               config: ExperimentConfig | None = None) -> ExperimentStore:
    """The experiment's store: embedded in its directory, or the shared database its directory names.
    The password of a shared one comes from the experiment's config in this process, else ``config``,
    else the file the experiment was created from, when their store is the recorded one; else from
    PGPASSWORD or ~/.pgpass."""
    from ..records.store import ExperimentStore

    exp_dir = Path(working_directory) / experiment_id
    if (exp_dir / DB_RELATIVE_PATH).is_file():
        return ExperimentStore.embedded(exp_dir, experiment_id)
    if (exp_dir / STORE_URL_FILE).is_file():
        recorded = (exp_dir / STORE_URL_FILE).read_text(encoding="utf-8").strip()
        candidates = (c() for c in (lambda: LIVE_CONFIGS.get(experiment_id), lambda: config,
                                     lambda: _creating_config(exp_dir)))  # the file is read only if needed
        for candidate in candidates:
            if candidate is not None and candidate.store_url is not None:
                url = candidate.store_url.get_secret_value()
                if _without_password(url) == _without_password(recorded):
                    return ExperimentStore(url, experiment_id)
        return ExperimentStore(recorded, experiment_id)
    raise ExperimentNotFound(f"no experiment {experiment_id!r} under {working_directory}; "
                             "`trialflow experiment list` shows the known ones")


def open_records(working_directory: str | os.PathLike[str], experiment_id: str) -> RecordSource:
    """The experiment's records to read: an :class:`~trialflow.records.store_reader.EmbeddedReader` for an embedded
    store at this code's schema, else its :class:`~trialflow.records.store.ExperimentStore` (see
    :mod:`trialflow.records.store_reader`). Raises what :func:`open_store` raises for an experiment it cannot open."""
    path = Path(working_directory) / experiment_id / DB_RELATIVE_PATH
    if path.is_file():
        reader = None
        try:
            reader = EmbeddedReader(path, experiment_id)
            if reader.schema_version() == SCHEMA_VERSION:
                return reader
        except (sqlite3.Error, StoreUnreadable):
            pass
        if reader is not None:
            reader.close()
    return open_store(working_directory, experiment_id)


def _creating_config(exp_dir: Path) -> ExperimentConfig | None:
    """The config file a shared-store experiment was created from, when it still loads (it may hold
    the store's password, which the experiment directory never does)."""
    from ..config import ConfigError

    try:
        return _load_quietly((exp_dir / CONFIG_FILE_NOTE).read_text(encoding="utf-8").strip())
    except (OSError, ConfigError):
        return None


def _load_quietly(path: str) -> ExperimentConfig:
    """``load_config`` without its warnings (they were shown when the experiment was created)."""
    from ..config import load_config

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_config(path)


def config_differences(stored: dict[str, Any], given: dict[str, Any]) -> list[str]:
    """The top-level fields in which two configs (as stored) differ, in order."""
    keys = [*stored, *(k for k in given if k not in stored)]
    return [k for k in keys if json.dumps(stored.get(k), sort_keys=True, default=str)
            != json.dumps(given.get(k), sort_keys=True, default=str)]


def note_changed_fields(store: ExperimentStore, fields: Iterable[str]) -> None:
    """Record that trialflow itself set these top-level fields of the stored config (`update
    searchspace`, a run's ``overrides``): the config file differing there is not an edit."""
    changed = set(store.controls().get(Control.CHANGED_FIELDS) or [])
    if not set(fields) <= changed:
        store.set_control(Control.CHANGED_FIELDS, sorted(changed | set(fields)))


def set_stored_fields(store: ExperimentStore, values: dict[str, Any], remove: Iterable[str] = ()) -> None:
    """Set top-level fields of the stored config (by their config-file names; ``remove``: fields it no
    longer has), noted as trialflow's own (:func:`note_changed_fields`): a later run keeps them although
    its config file says otherwise."""
    stored = store.experiment().config
    stored.update(values)
    for name in remove:
        stored.pop(name, None)
    store.set_experiment(config=json.dumps(stored))
    note_changed_fields(store, values)


def _with_changes(store: ExperimentStore, record: ExperimentRecord,
                  given: ExperimentConfig) -> tuple[ExperimentConfig, list[str]]:
    """``given`` (a config file's) with the fields trialflow set itself taken from the stored copy, and
    the fields in which the file differs otherwise (edits)."""
    from ..config import ExperimentConfig

    changed = set(store.controls().get(Control.CHANGED_FIELDS) or [])
    differ = config_differences(record.config, given.dump())
    taken = [k for k in differ if k in changed]
    if taken:
        stored = stored_config(store)
        names = {field.alias or name: name for name, field in ExperimentConfig.model_fields.items()}
        given = given.model_copy(update={names[k]: getattr(stored, names[k]) for k in taken if k in names})
    return given, [k for k in differ if k not in changed]


def load_experiment_config(store: ExperimentStore, config_path: str | None = None,
                           given: ExperimentConfig | None = None, to_run: bool = True) -> ExperimentConfig:
    """The config the stored experiment runs with: always its own. The in-process original when this
    process created it; else the config of ``config_path`` (``given``, when the caller loaded it
    already) or of the file it was created from, when it still describes the same experiment (it holds
    secrets the stored copy masks); else the stored copy.

    Fields trialflow set itself (``update searchspace``, a run's overrides) come from the stored copy
    and are no edit of the file. An edited file is warned about when the config is loaded ``to_run``
    the experiment (a read-only command's look at its platform says nothing).

    Raises :class:`ConfigMismatch` when ``config_path`` describes another experiment (naming the
    fields that differ), and :class:`ConfigError` when it does not load."""
    from ..config import ConfigError, load_config

    live = LIVE_CONFIGS.get(store.experiment_id)
    record = store.experiment()
    if config_path:
        given, differ = _with_changes(store, record, given or load_config(config_path))
        if differ:
            raise ConfigMismatch(f"{config_path} describes another experiment than {record.id} (they differ in "
                                 f"{', '.join(differ)}): run a stored experiment without a config path, or "
                                 "with the file it was created from")
        return live or given
    if live is not None:
        return live
    if record.config_path and Path(record.config_path).is_file():
        try:
            given = _load_quietly(record.config_path)
        except ConfigError as exc:
            log.log(logging.WARNING if to_run else logging.DEBUG, "the experiment's config file %s no longer "
                    "loads (%s): running the stored config", record.config_path, exc)
        else:
            given, differ = _with_changes(store, record, given)
            if not differ:
                return given
            log.log(logging.WARNING if to_run else logging.DEBUG, "the experiment's config file %s changed since "
                    "it was created (%s): running the stored config", record.config_path, ", ".join(differ))
    return stored_config(store)


def stored_config(store: ExperimentStore) -> ExperimentConfig:
    """The config stored with the experiment, parsed. Copies stored before the search space's file
    was dropped from them hold both ``searchSpace`` and ``searchSpaceFile``: the content wins."""
    from ..config import parse_config

    data = dict(store.experiment().config)
    if data.get("searchSpace") is not None:
        data.pop("searchSpaceFile", None)
    return parse_config(data, source=f"stored config of {store.experiment_id}")


@dataclass
class ExperimentEntry:
    id: str
    root: Path
    record: ExperimentRecord


def search_roots(root: str | os.PathLike[str] | None = None) -> list[Path]:
    """Where experiments are looked for, as absolute paths (a relative ``root`` is taken from here;
    a notebook may pass it as text)."""
    return [Path(root).resolve()] if root is not None else [default_root().resolve(), *_registered_roots()]


def find_experiment(experiment_id: str, root: str | os.PathLike[str] | None = None) -> tuple[Path, ExperimentStore]:
    """The working directory and store of an experiment (default root, then registered roots)."""
    base = _working_directory_of(experiment_id, root)
    return base, open_store(base, experiment_id)


def find_records(experiment_id: str, root: str | os.PathLike[str] | None = None) -> tuple[Path, RecordSource]:
    """:func:`find_experiment` for reading records only (``trial ls``, ``experiment export``): the store
    read through :func:`open_records`."""
    base = _working_directory_of(experiment_id, root)
    return base, open_records(base, experiment_id)


def _working_directory_of(experiment_id: str, root: str | os.PathLike[str] | None) -> Path:
    for base in search_roots(root):
        if has_store(base / experiment_id):
            return base
    raise ExperimentNotFound(f"no experiment {experiment_id!r} found; `trialflow experiment list` shows the "
                             "known ones (use --root for another working directory)")


def _api_port(api: str | None) -> int | None:
    from urllib.parse import urlsplit

    try:
        return urlsplit(api).port if api else None
    except ValueError:
        return None


def web_port(record: ExperimentRecord) -> int | None:
    """The web UI port the experiment was given as its address (NNI's Python API's ``start(8080)``,
    ``create --port``), while the experiment is on it: while it runs, and after its end while the process
    that gave it lives and has not stopped it, as NNI's manager keeps its port until it is stopped."""
    from ..trial.procs import pid_alive

    held = record.controls.get(Control.WEB_PORT)
    if not isinstance(held, dict) or not isinstance(held.get("port"), int):
        return None
    if record.status in EXPERIMENT_LIVE:
        return held["port"]
    pid = held.get("pid")
    return held["port"] if isinstance(pid, int) and pid_alive(pid, held.get("start_time")) else None


def shown_port(record: ExperimentRecord) -> int | None:
    """The one port nnictl's listing would show for the experiment, which ``trialflow stop --port``
    finds it on: its own web port (:func:`web_port`), else its Prefect API's while it runs; None when
    it is on none."""
    own = web_port(record)
    return own if own is not None else _live_api_port(record)


def platform_of(record: ExperimentRecord) -> str | None:
    """The experiment's platform as its stored config names it: ``hybrid`` for several sections, None
    for a config without one."""
    services = record.config.get("trainingService")
    if isinstance(services, list):
        return "hybrid"
    return services.get("platform") if isinstance(services, dict) else None


def _live_api_port(record: ExperimentRecord) -> int | None:
    """The port of the Prefect API the experiment reports to, while it runs."""
    return _api_port(record.prefect_api) if record.status in EXPERIMENT_LIVE else None


def _ports(record: ExperimentRecord) -> set[int]:
    """The ports an experiment is on now: while it runs, its Prefect API's; and its web UI port."""
    ports = {web_port(record), _live_api_port(record)}
    return {p for p in ports if p is not None}


def the_one_on_port(port: int, root: Path | None = None, unreadable: list[str] | None = None) -> ExperimentEntry:
    """The one experiment (under ``root``, or the known roots) on ``port``, nnictl's web UI port: a
    running experiment's Prefect API port on its host, or its :func:`web_port`; a running one first,
    then the one whose own address it is. ``unreadable`` as :func:`list_experiments`. Raises
    :class:`ExperimentNotFound` when none is (naming the ports in use), or several are (naming them)."""
    known = [(e, _ports(e.record)) for e in list_experiments(root, unreadable)]
    on_port = [e for e, ports in known if port in ports]
    if len(on_port) > 1:  # a running one before those its starter still holds after their end
        on_port = [e for e in on_port if e.record.status in EXPERIMENT_LIVE] or on_port
    if len(on_port) > 1:  # then the one whose own address it is before those whose server is there
        on_port = [e for e in on_port if web_port(e.record) == port] or on_port
    if len(on_port) > 1:
        raise ExperimentNotFound(f"{len(on_port)} experiments are on port {port} "
                                 f"({', '.join(e.id for e in on_port)}): give the id of one")
    if not on_port:
        in_use = sorted({p for _, ports in known for p in ports})
        where = f" (ports in use: {', '.join(map(str, in_use))})" if in_use else ""
        raise ExperimentNotFound(f"no experiment is on port {port}{where}: "
                                 "`trialflow experiment list` shows the running ones")
    return on_port[0]


def list_experiments(root: Path | None = None, unreadable: list[str] | None = None) -> list[ExperimentEntry]:
    """The experiments under ``root`` (or the known roots), by id; one whose store cannot be read is
    skipped, and its one-line reason added to ``unreadable`` when given."""
    out: list[ExperimentEntry] = []
    for base in search_roots(root):
        if not base.is_dir():
            continue
        for exp_dir in sorted(d for d in base.iterdir() if has_store(d)):
            exp_id = exp_dir.name
            if any(e.id == exp_id for e in out):
                continue
            try:
                store = open_records(base, exp_id)
            except StoreUnreadable as exc:
                if unreadable is not None:
                    unreadable.append(f"{exp_id}: {exc}")
                continue
            try:
                out.append(ExperimentEntry(exp_id, base, store.experiment()))
            except KeyError:
                continue
            except StoreUnreadable as exc:
                if unreadable is not None:
                    unreadable.append(f"{exp_id}: {exc}")
            finally:
                store.close()
    return out
