"""THE platform table: one row per platform (:class:`~.platform_row.Platform`: config model, service
class, credentials block, pip extra, retry policy). The service factory, the list of available
platforms in error messages and the Prefect tasks' retries read it.

The built-in rows are the config loader's sections (``trialflow.config.PLATFORM_CONFIGS``, in the
config layer below this one), each paired with its service by name: the section model of
``config/sections/<name>.py`` runs in the service module ``platforms/<name>.py``, whose ``PLATFORM`` is
its row -- the shape a plugin package has; a row is read (its service module imported) when first looked
up. Platforms of other packages add their row through the
``trialflow.platforms`` entry point (``trialflow.config.plugins``); :func:`platform` and
:func:`available` include them. A new built-in platform adds the files listed in
``docs/platforms.md#adding-a-platform``; nothing in ``tasks/``, ``flows/`` or the other platforms changes.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from pathlib import Path

from ..config import PLATFORM_CONFIGS, TrainingServiceConfig
from .base import TrainingService
from .errors import PlatformError
from .platform_row import Platform


def _built_in_row(name: str, config: type[TrainingServiceConfig]) -> Platform:
    """The row of the built-in platform whose section model is ``config``: the ``PLATFORM`` of the
    service module named as the model's module. Raises ImportError when the pair is broken."""
    module = importlib.import_module(f"{__package__}.{config.__module__.rpartition('.')[2]}")
    row = getattr(module, "PLATFORM", None)
    if not isinstance(row, Platform) or row.config is not config or row.name != name:
        raise ImportError(f"{module.__name__} defines no PLATFORM row for the {name!r} section {config.__name__}")
    return row


class _BuiltInRows(Mapping[str, Platform]):
    """The built-in rows by name, each read from its service module when it is first looked up: a
    process that runs one platform imports that platform's service module and client libraries only.
    Membership and iteration need no import; a lookup raises ImportError when the pair is broken."""

    def __init__(self, configs: Mapping[str, type[TrainingServiceConfig]]) -> None:
        self._configs = configs
        self._rows: dict[str, Platform] = {}

    def __getitem__(self, name: str) -> Platform:
        row = self._rows.get(name)
        if row is None:
            row = self._rows[name] = _built_in_row(name, self._configs[name])
        return row

    def __contains__(self, name: object) -> bool:
        return name in self._configs

    def __iter__(self) -> Iterator[str]:
        return iter(self._configs)

    def __len__(self) -> int:
        return len(self._configs)


PLATFORMS: Mapping[str, Platform] = _BuiltInRows(PLATFORM_CONFIGS)


_SKIPPED: set[str] = set()  # plugin rows already warned about


def plugin_rows() -> dict[str, Platform]:
    """The rows other packages registered (entry point group ``trialflow.platforms``, or
    ``register_platform`` in this process) whose service is a :class:`TrainingService`; others are
    skipped with a warning (once per process and name). Read anew at each call: a row registered
    later counts from then on."""
    from ..config.plugins import log, platform_plugins

    rows = {}
    for name, row in platform_plugins().items():
        if name in PLATFORMS:
            problem = "a built-in platform has that name"
        elif isinstance(row, Platform) and isinstance(row.service, type) and issubclass(row.service, TrainingService):
            rows[name] = row
            continue
        else:
            problem = ("its entry point must name a trialflow.platforms.Platform row whose service is a "
                       "TrainingService subclass")
        if name not in _SKIPPED:
            _SKIPPED.add(name)
            log.warning("platform plugin %r is skipped: %s", name, problem)
    return rows


def available() -> list[str]:
    """Names of the platforms whose training service can run (built-in, then plugins)."""
    rows = {**PLATFORMS, **plugin_rows()}
    return [name for name, row in rows.items() if row.service is not None]


def platform(name: str) -> Platform:
    row = PLATFORMS.get(name) or plugin_rows().get(name)
    if row is None:
        raise PlatformError(f"unknown platform {name!r}; known: {', '.join([*PLATFORMS, *plugin_rows()])}")
    return row


def create_service(config: TrainingServiceConfig, experiment_dir: Path) -> TrainingService:
    """The training service of ``config``'s platform for the experiment in ``experiment_dir``."""
    row = platform(config.platform)
    if row.service is None:
        raise PlatformError(f"the {config.platform!r} training service is not available in this version of "
                            f"trialflow; available: {', '.join(available())}")
    return row.service(config, experiment_dir)  # type: ignore[call-arg]

