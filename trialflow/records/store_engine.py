"""Opening an experiment store's database: the URL of an experiment folder's embedded SQLite file, the
SQLAlchemy engine of a URL (SQLite in WAL mode, or a shared PostgreSQL), the one-line error for a store
that cannot be read, the experiments a database holds, and the JSON the store writes (never a NaN or
Infinity token)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from .store_records import DB_RELATIVE_PATH, StoreUnreadable, store_unreadable
from .store_schema import experiments, where


def dumps(value: Any) -> str:
    """JSON that never contains NaN/Infinity tokens (they become strings)."""
    return json.dumps(_finite(value), separators=(",", ":"), sort_keys=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def embedded_url(experiment_dir: str | os.PathLike[str]) -> str:
    """The URL of an experiment folder's embedded SQLite store (its ``db/`` folder made when missing)."""
    path = Path(experiment_dir) / DB_RELATIVE_PATH
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def open_engine(url: str) -> Engine:
    """The SQLAlchemy engine of a store URL: SQLite in WAL mode with a 30 s busy wait, or a pooled
    server database. Raises ImportError naming the extra when the URL's driver is missing."""
    if url.startswith("sqlite"):
        engine = sa.create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @sa.event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")  # durable against process death, fast commits
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    try:
        return sa.create_engine(url, pool_pre_ping=True)
    except ImportError as exc:
        raise ImportError(f"the store URL needs a database driver ({exc}); pip install 'trialflow[postgres]'") from None


def unreadable_error(url: str, exc: BaseException) -> StoreUnreadable:
    """The one-line error for a store at ``url`` that could not be read (``exc``: what the driver said)."""
    return store_unreadable(where(url), getattr(exc, "orig", None) or exc, url.startswith("sqlite"))


def stored_experiment_ids(url: str) -> list[str]:
    """The ids of the experiments a database holds (an embedded file normally holds one)."""
    engine = open_engine(url)
    try:
        with engine.connect() as conn:
            if not sa.inspect(conn).has_table("experiments"):
                return []
            return [row[0] for row in conn.execute(sa.select(experiments.c.id).order_by(experiments.c.id))]
    finally:
        engine.dispose()
