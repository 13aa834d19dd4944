"""Platforms from other packages: the ``trialflow.platforms`` entry point group.

A package of the user's own registers one entry point whose object is a platform row
(``trialflow.platforms.Platform``: config model, service class, credentials block, pip extra, retry
policy); ``docs/platforms.md#third-party-platforms`` has a worked example. The config loader asks
for plugins the first time it meets a platform name it does not know (so configs of built-in
platforms never import a plugin), and the platform table adds the same rows.

Lifecycle: :func:`platform_plugins` loads every entry point of the group once per process and keeps
the rows; a plugin that fails to load, or whose row is not a row, is skipped with a warning naming
the package and why (the experiment then reports an unknown platform with the known ones). A row
given to :func:`register_platform` (a test's, an embedding program's) joins them for this process.
"""

from __future__ import annotations

import logging
from functools import cache
from typing import Any

from pydantic import BaseModel

GROUP = "trialflow.platforms"
log = logging.getLogger("trialflow.config")


_REGISTERED: dict[str, Any] = {}  # rows registered in this process, by platform name


def register_platform(row: Any) -> None:
    """Make the platform ``row`` (a ``trialflow.platforms.Platform``) known to this process, beside the
    entry points' rows; its config model's ``platform`` default names it."""
    _REGISTERED[str(row.config.model_fields["platform"].default)] = row


def platform_plugins() -> dict[str, Any]:
    """Platform name -> the row a plugin registered (the entry points', loaded once per process, then
    this process's own)."""
    return {**_entry_point_rows(), **_REGISTERED}


@cache
def _entry_point_rows() -> dict[str, Any]:
    from importlib.metadata import entry_points

    rows: dict[str, Any] = {}
    for point in entry_points(group=GROUP):
        where = f"platform plugin {point.name!r} ({point.value})"
        try:
            row = point.load()
            config = row.config
            name = str(config.model_fields["platform"].default)
        except Exception as exc:  # a broken third-party package must not break built-in platforms
            log.warning("%s is skipped: it does not load (%s: %s)", where, type(exc).__name__, exc)
            continue
        if not (isinstance(config, type) and issubclass(config, BaseModel)):
            log.warning("%s is skipped: its row's config must be a config model", where)
            continue
        rows[name] = row
    return rows


def plugin_config(name: str) -> type[BaseModel] | None:
    """The config model of the plugin platform ``name`` (None when no plugin has it); the config loader
    asks only for names that are not built in, so a plugin never replaces a built-in platform."""
    row = platform_plugins().get(name)
    return None if row is None else row.config  # type: ignore[no-any-return]
