"""Registered algorithms: ``trialflow algo register --meta meta.yml`` (NNI's ``nnictl algo register``).

A meta file holds NNI's fields: ``algoType`` (tuner | assessor), ``builtinName``, ``className``
(``module.Class``) and optionally ``classArgsValidator``; its folder is the algorithm's code
directory unless the module is importable anyway. Entries live in
``$TRIALFLOW_CONFIG_DIR/registered_algorithms.yml`` (default ``~/.config/trialflow``); a config then
names the algorithm like a built-in one: ``tuner: {name: <builtinName>}``. PyYAML loads when a file is read or
written (the read-only commands import this module and read none).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .base import TunerError

ALGO_TYPES = ("tuner", "assessor")


@dataclass(frozen=True)
class RegisteredAlgorithm:
    builtin_name: str
    algo_type: str
    class_name: str
    code_directory: str | None = None
    class_args_validator: str | None = None


def registry_file() -> Path:
    base = os.environ.get("TRIALFLOW_CONFIG_DIR") or os.path.join("~", ".config", "trialflow")
    return Path(os.path.expanduser(base)) / "registered_algorithms.yml"


def registered_algorithms() -> list[RegisteredAlgorithm]:
    import yaml

    path = registry_file()
    if not path.is_file():
        return []
    try:
        entries = yaml.safe_load(path.read_text(encoding="utf-8")) or []
        return [RegisteredAlgorithm(**entry) for entry in entries]
    except (yaml.YAMLError, TypeError) as exc:
        raise TunerError(f"the registered algorithms file {path} is damaged ({exc}); fix or delete it") from None


def registered(name: str | None) -> RegisteredAlgorithm | None:
    """The algorithm registered under ``name`` (case-insensitive), if any."""
    if not name:
        return None
    return next((a for a in registered_algorithms() if a.builtin_name.lower() == name.lower()), None)


def read_meta(path: Path) -> RegisteredAlgorithm:
    """An NNI meta file as an entry; every problem names the field."""
    import yaml

    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise TunerError(f"cannot read meta file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise TunerError(f"meta file {path} is not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise TunerError(f"meta file {path} must be a mapping with algoType, builtinName and className")
    fields = {k.lower(): v for k, v in raw.items() if isinstance(k, str)}
    missing = [k for k in ("algoType", "builtinName", "className") if not fields.get(k.lower())]
    if missing:
        raise TunerError(f"meta file {path}: missing {', '.join(missing)} (e.g. algoType: tuner, "
                         "builtinName: MyTuner, className: my_tuner.MyTuner)")
    algo_type = str(fields["algotype"]).lower()
    if algo_type not in ALGO_TYPES:
        raise TunerError(f"meta file {path}: algoType must be tuner or assessor (got {fields['algotype']!r}; "
                         "advisors are not supported)")
    validator = fields.get("classargsvalidator")
    return RegisteredAlgorithm(str(fields["builtinname"]), algo_type, str(fields["classname"]),
                               str(path.resolve().parent), str(validator) if validator else None)


def register(entry: RegisteredAlgorithm, builtin: set[str]) -> None:
    """Add ``entry``; a name taken by a built-in or an earlier registration is refused."""
    if entry.builtin_name.lower() in builtin:
        raise TunerError(f"{entry.builtin_name!r} is the name of a built-in algorithm; choose another builtinName")
    if registered(entry.builtin_name) is not None:
        raise TunerError(f"{entry.builtin_name!r} is already registered; `trialflow algo unregister "
                         f"{entry.builtin_name}` first")
    _write([*registered_algorithms(), entry])


def unregister(name: str) -> RegisteredAlgorithm:
    entry = registered(name)
    if entry is None:
        raise TunerError(f"no algorithm is registered as {name!r} (see `trialflow algo list`)")
    _write([a for a in registered_algorithms() if a != entry])
    return entry


def _write(entries: list[RegisteredAlgorithm]) -> None:
    import yaml

    path = registry_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    data: list[dict[str, Any]] = [asdict(e) for e in entries]
    tmp.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    tmp.replace(path)
