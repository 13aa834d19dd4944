"""Reading config and search-space files: YAML (safely, ``1e-06`` a number) or JSON, refused with one
line when too large, too deep, or expanding past a limit through YAML's anchors and aliases."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import yaml

from ._base import ConfigError

# What a config or search-space file may hold once YAML's anchors and aliases are expanded (a 632-byte
# file of nested aliases expands to 80 MB): well above any real experiment's.
MAX_CONFIG_BYTES = 10 * 1024 * 1024
MAX_CONFIG_VALUES = 200_000


def _expanded_size_ok(data: Any, limit: int = MAX_CONFIG_VALUES) -> bool:
    """Whether ``data`` holds at most ``limit`` values counted as written out (shared parts counted at
    every place they appear); stops counting at the limit, so a bomb costs no more than that."""
    count, stack = 0, [data]
    while stack:
        item = stack.pop()
        count += 1
        if count > limit:
            return False
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return True


class _ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader that also reads a number with an exponent and no dot (``1e-06``, as JSON and
    Python write small numbers) as a float, as YAML 1.2 does; YAML 1.1 makes it a string."""


_ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:float",
                                   re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
                                   list("-+0123456789"))


def _load_yaml(text: str, what: str) -> Any:
    """A config or search-space text read as YAML (safely; ``1e-06`` is a number), refusing one too big
    once expanded."""
    if len(text) > MAX_CONFIG_BYTES:
        raise ValueError(f"{what} is {len(text)} bytes; the limit is {MAX_CONFIG_BYTES}")
    try:
        data = yaml.load(text, Loader=_ConfigLoader)  # noqa: S506 -- a SafeLoader
    except RecursionError:
        raise ValueError(_too_deep(what)) from None
    if not _expanded_size_ok(data):
        raise ValueError(f"{what} expands to more than {MAX_CONFIG_VALUES} values (YAML anchors and aliases "
                         "repeat what they name at every use): write the values out, or reuse fewer")
    return data


def _too_deep(what: str) -> str:
    return f"{what} nests lists or mappings deeper than can be read (about a thousand levels): flatten it"


def load_search_space_file(path: Path) -> Any:
    """A search space file as JSON, falling back to YAML."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f'cannot read searchSpaceFile "{path}": {exc.strerror}') from None
    if len(text) > MAX_CONFIG_BYTES:
        raise ValueError(f'searchSpaceFile "{path}" is {len(text)} bytes; the limit is {MAX_CONFIG_BYTES}')
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        as_json = f"{exc.msg} at line {exc.lineno}, column {exc.colno}"
    except RecursionError:
        raise ValueError(_too_deep(f'searchSpaceFile "{path}"')) from None
    try:
        return _load_yaml(text, f'searchSpaceFile "{path}"')
    except yaml.YAMLError as exc:
        raise ValueError(f'searchSpaceFile "{path}" is neither valid JSON ({as_json}) nor YAML '
                         f"({''.join(_yaml_problem(exc))}): mend it at one of those places") from None


def _yaml_problem(exc: yaml.YAMLError) -> tuple[str, str]:
    """What PyYAML found wrong, on one line, and where (`` at line L, column C``, or nothing)."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    return getattr(exc, "problem", None) or str(exc).splitlines()[0], where


def read_config_file(path: str | os.PathLike[str]) -> tuple[Any, Path]:
    """The raw mapping of a YAML or JSON config file and the file's resolved path."""
    file = Path(os.path.expanduser(os.fspath(path)))
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([f'config file "{file}" does not exist'], str(file)) from None
    except OSError as exc:
        raise ConfigError([f'cannot read config file "{file}": {exc.strerror}'], str(file)) from None
    try:
        return _load_yaml(text, f'config file "{file}"'), file.resolve()
    except ValueError as exc:
        raise ConfigError([str(exc)], str(file)) from None
    except yaml.YAMLError as exc:
        problem, where = _yaml_problem(exc)
        raise ConfigError([f"not valid YAML{where}: {problem}"], str(file)) from None
