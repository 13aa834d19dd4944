"""A new local Prefect database starts as a copy of an empty one this user's servers already migrated.

A Prefect server that starts on a SQLite database that does not exist yet runs every one of Prefect's
migrations first (more CPU than the rest of its start). So once a
server of a Prefect version has started healthy on a new database, :func:`remember` keeps an empty copy
of it, the *template*: Prefect's schema and the block types (schemas only), and nothing else (every
other table emptied: no run, log, event, variable or block document of any experiment). :func:`seed` puts a
copy of the template where a new database is about to be made, and the server started on that copy
skips Prefect's migration check and its registration of block types (:func:`seeded_settings`): the
template is at its version's last migration and holds the block types that registration writes, which
come from Prefect and the Prefect collections installed (entry points ``prefect.collections``).

Lifecycle: one template per Prefect version and set of installed collections,
``<cache>/prefect-db/<version>-<collections>.db`` (:func:`template_for`) where ``<cache>`` is
``TRIALFLOW_CACHE_DIR``, else ``$XDG_CACHE_HOME/trialflow``, else ``~/.cache/trialflow`` (folders 0700,
file 0600), made from a database of at most 16 MB, written whole under a temporary name and renamed,
never changed in place. A template is used only when it is a regular file (no link) this user owns
that no one else may write, checked on the opened file, and when its copy reads as an intact SQLite
database at a migration revision; anything else is left alone and the server migrates and registers
as on any new database. A template is made only where the environment leaves Prefect's migration at
start-up on, so that it is at its version's last migration.
Neither function raises: a cache that cannot be read or written costs the migration, nothing more.

A server's folder also notes, in ``database.json``, the Prefect version its database was last healthy
under (:func:`note_migrated`); :func:`start_settings` skips Prefect's migration check at the next start
with that version, or seeds a database about to be made.

Standard library only (the kept server's module imports this before Prefect).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

from ..trial.procs import read_json, write_atomic

log = logging.getLogger("trialflow.server")
DATABASE_MARK = "database.json"  # in a server's folder: the Prefect version last healthy on its database
MIGRATE_SETTING = "PREFECT_API_DATABASE_MIGRATE_ON_START"
MIGRATE_NAMES = (MIGRATE_SETTING, "PREFECT_SERVER_DATABASE_MIGRATE_ON_START")  # Prefect reads either
REGISTER_NAMES = ("PREFECT_API_BLOCKS_REGISTER_ON_START", "PREFECT_SERVER_REGISTER_BLOCKS_ON_START")
COLLECTIONS_GROUP = "prefect.collections"  # the entry points whose packages bring block types of their own
KEPT_TABLES = ("alembic_version", "block_type", "block_schema", "block_schema_reference")
MAX_TEMPLATE_BYTES = 64 * 1024 * 1024
MAX_SOURCE_BYTES = 16 * 1024 * 1024  # a new database is ~1.3 MB
SQLITE_URL = "sqlite+aiosqlite:///"


def prefect_version() -> str | None:
    """The installed Prefect's version (package metadata: Prefect itself is not imported)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("prefect")
    except PackageNotFoundError:
        return None


def start_settings(folder: Path, database: Path, version: str | None, env: dict[str, str]) -> dict[str, str]:
    """Settings for a server of Prefect ``version`` (:func:`prefect_version`) starting in ``folder`` on its
    SQLite ``database``: no migration check when that database was last healthy under this version
    (:func:`note_migrated`); else a database about to be made is seeded (:func:`seed`). Nothing for a
    database or a migration setting the environment ``env`` chose."""
    if any(key.endswith(("_DATABASE_CONNECTION_URL", "_DATABASE_MIGRATE_ON_START")) for key in env):
        return {}
    if version is not None and database.exists() and read_json(str(folder / DATABASE_MARK)) == {"prefect": version}:
        return {MIGRATE_SETTING: "false"}
    return seeded_settings(env) if seed(database, version) else {}


def seeded_settings(env: Mapping[str, str]) -> dict[str, str]:
    """Settings for a server's first start on a database :func:`seed` just made: neither Prefect's
    migration check nor its registration of block types, both already in the copy, except where ``env``
    sets either itself. (Prefect still notes the block types it would have registered, so a later start
    skips their registration as it does after any start.)"""
    return {names[0]: "false" for names in (MIGRATE_NAMES, REGISTER_NAMES) if not any(name in env for name in names)}


def note_migrated(folder: Path, database: Path, version: str | None) -> None:
    """A server in ``folder`` answered healthy on ``database`` under Prefect ``version``: noted for
    :func:`start_settings`; the first time, the database is also kept as the template of new ones when
    there is none."""
    mark = str(folder / DATABASE_MARK)
    if version and read_json(mark) != {"prefect": version}:
        write_atomic(mark, {"prefect": version})
        remember(database, version)


def cache_folder() -> Path:
    """Where trialflow keeps what it may rebuild at any time (``TRIALFLOW_CACHE_DIR`` first)."""
    if os.environ.get("TRIALFLOW_CACHE_DIR"):
        return Path(os.environ["TRIALFLOW_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "trialflow"


def template_for(version: str) -> Path:
    """The template of Prefect ``version`` with the Prefect collections installed now (a collection
    installed or upgraded later makes a new template, so its block types are registered)."""
    return cache_folder() / "prefect-db" / f"{version}-{collections_key()}.db"


def collections_key() -> str:
    """A short digest of the installed Prefect collections: each entry point of
    :data:`COLLECTIONS_GROUP` with its package's name and version (package metadata only)."""
    import hashlib
    from importlib.metadata import entry_points

    found = sorted(f"{point.name}={point.value} {point.dist.name if point.dist else ''} "
                   f"{point.dist.version if point.dist else ''}" for point in entry_points(group=COLLECTIONS_GROUP))
    return hashlib.sha256("\n".join(found).encode()).hexdigest()[:12]


def database_of(url: str | None) -> Path | None:
    """The file of a SQLite database URL as Prefect writes it (None for any other database)."""
    if not url or not url.startswith(SQLITE_URL) or ":memory:" in url:
        return None
    return Path(url[len(SQLITE_URL):].split("?", 1)[0])


def seed(database: Path, version: str | None) -> bool:
    """Copy the template of ``version`` to ``database`` when that file does not exist; True when it did.
    The copy is checked (SQLite's quick check, a migration revision) before it takes the name; an
    existing file is never replaced."""
    if version is None or database.exists():
        return False
    try:
        content = _read_trusted(template_for(version))
        if content is None:
            return False
        database.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(prefix=".seed-", suffix=".db", dir=database.parent)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(content)
            if not _migrated(Path(temporary)):
                return False
            os.link(temporary, database)  # fails when the database appeared meanwhile: that one is kept
        finally:  # with what SQLite made beside it when it read it (a WAL header: -wal, -shm)
            for made in (temporary, f"{temporary}-wal", f"{temporary}-shm", f"{temporary}-journal"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(made)
    except (OSError, sqlite3.Error) as exc:
        log.debug("no template database for %s: %s", database, exc)
        return False
    return True


def remember(database: Path, version: str | None) -> None:
    """Keep an empty copy of ``database`` (migrated by a healthy server of ``version``) as the template,
    when there is none yet. The copy is a consistent snapshot even while the server writes."""
    if version is None or _migration_off(os.environ):
        return
    template = template_for(version)
    try:
        if template.exists() or not database.is_file() or database.stat().st_size > MAX_SOURCE_BYTES:
            return  # a large database is no new one: copying it to empty it would cost more than it saves
        folder = template.parent
        folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder.mkdir(mode=0o700, exist_ok=True)
        fd, temporary = tempfile.mkstemp(prefix=".template-", suffix=".db", dir=folder)
        os.close(fd)
        os.unlink(temporary)  # VACUUM INTO writes a new file
        try:
            source = sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=5)
            try:
                source.execute("VACUUM INTO ?", (temporary,))
            finally:
                source.close()
            os.chmod(temporary, 0o600)
            _empty(Path(temporary))
            if _migrated(Path(temporary)):
                os.replace(temporary, template)
        finally:
            if os.path.exists(temporary):
                os.unlink(temporary)
    except (OSError, sqlite3.Error) as exc:
        log.debug("no template kept from %s: %s", database, exc)


def _migration_off(env: Mapping[str, str]) -> bool:
    """Whether ``env`` turns Prefect's migration at start-up off (a database of such a server may be
    at an earlier revision than its version's last)."""
    return any(env.get(name, "").strip().lower() in ("false", "0", "no", "off") for name in MIGRATE_NAMES)


def _empty(path: Path) -> None:
    """Delete every row but Prefect's schema revision and block types (schemas, never a block's values);
    compact the file."""
    db = sqlite3.connect(path)
    try:
        tables = [name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                                  "AND name NOT LIKE 'sqlite_%'")]
        db.execute("PRAGMA foreign_keys = OFF")
        for name in tables:
            if name not in KEPT_TABLES:
                db.execute(f'DELETE FROM "{name.replace(chr(34), chr(34) * 2)}"')
        db.commit()
        db.execute("VACUUM")
    finally:
        db.close()


def _migrated(path: Path) -> bool:
    """Whether ``path`` reads as an intact SQLite database at some Prefect migration revision."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        if db.execute("PRAGMA quick_check").fetchone() != ("ok",):
            return False
        return db.execute("SELECT count(*) FROM alembic_version").fetchone()[0] == 1
    except sqlite3.Error:
        return False
    finally:
        db.close()


def _read_trusted(path: Path) -> bytes | None:
    """The bytes of ``path`` when it is a regular file (no link) this user owns, writable by no one
    else, of a sane size -- checked on the opened file, so a file swapped in meanwhile is not read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as source:
        info = os.fstat(fd)
        if not (stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o022
                and 0 < info.st_size <= MAX_TEMPLATE_BYTES):
            return None
        return source.read(MAX_TEMPLATE_BYTES)
