"""Shared machinery of the experiment config: NNI's key matching, unit strings and error messages.

NNI matches config keys case- and underscore-insensitively (``trial_concurrency`` ==
``trialConcurrency``); every model here inherits :class:`ConfigModel`, which canonicalises keys to
their camelCase alias before pydantic validates them and marks unknown keys with the closest valid
name so the final error can suggest it.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    GetJsonSchemaHandler,
    SecretStr,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidationInfo,
    model_serializer,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from ..foundation.user_errors import UserError

# An unknown key is renamed to "<key><_SUGGEST><closest valid name>" so that pydantic's
# "extra_forbidden" error carries the suggestion through to format_errors().
_SUGGEST = "\x00"


class ConfigError(UserError, ValueError):
    """A config that cannot be used; ``problems`` holds one message per bad field."""

    def __init__(self, problems: list[str], source: str | None = None) -> None:
        self.problems = problems
        self.source = source
        where = f" ({source})" if source else ""
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"Invalid experiment config{where}:\n{lines}")


class ConfigWarning(UserWarning):
    """A field that is accepted but does something else than in NNI, or nothing here; the message
    starts with the field's path and says what to do."""


def canonical_key(key: str) -> str:
    """NNI's key identity: lower case, underscores removed."""
    return key.lower().replace("_", "")


class ConfigModel(BaseModel):
    """Base of every config section: camelCase aliases, NNI key matching, unknown keys refused."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_default=False,
        hide_input_in_errors=True,
        coerce_numbers_to_str=True,  # NNI's examples write ``password: 12345``, ``user: 1000``
    )

    @model_validator(mode="before")
    @classmethod
    def _canonicalise_keys(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        known = {canonical_key(f.alias or name): (f.alias or name) for name, f in cls.model_fields.items()}
        secret_aliases = {f.alias or name for name, f in cls.model_fields.items() if "SecretStr" in str(f.annotation)}
        out: dict[str, Any] = {}
        for key, value in data.items():
            if not isinstance(key, str):
                out[f"{key!r}{_SUGGEST}"] = value
                continue
            alias = known.get(canonical_key(key))
            if alias is None:
                close = difflib.get_close_matches(canonical_key(key), list(known), n=1, cutoff=0.6)
                out[f"{key}{_SUGGEST}{known[close[0]] if close else ''}"] = value
            elif value is not None:  # NNI: setting a field to null is the same as not setting it
                secret = alias in secret_aliases and isinstance(value, int | float) and not isinstance(value, bool)
                out[alias] = str(value) if secret else value
        return out

    def dump(self) -> dict[str, Any]:
        """camelCase dict without unset (None) fields; secrets stay masked."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def _without_serializer(schema: CoreSchema) -> CoreSchema:
    """``schema`` (a model's, maybe inside its validators) without the model's serializer function."""
    if schema["type"] == "model":
        return {k: v for k, v in schema.items() if k != "serialization"}  # type: ignore[return-value]
    inner = schema.get("schema")
    return {**schema, "schema": _without_serializer(inner)} if isinstance(inner, dict) else schema  # type: ignore[return-value,arg-type]


class OrderedDump(ConfigModel):
    """A section whose dumps list its keys in an explicit order: first the fields ``dump_order`` does
    not name (the fields every section has), in field order, then the named ones in that order.
    Sections built from shared bases (an SSH login, a Kubernetes section) name theirs, so a stored
    config keeps the key order it always had whatever order the bases give the fields."""

    dump_order: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def _ordered(cls, data: dict[str, Any], by_alias: bool) -> dict[str, Any]:
        fields = cls.model_fields
        named = [(fields[n].alias or n) if by_alias else n for n in cls.dump_order]
        last = set(named)
        return {k: v for k, v in data.items() if k not in last} | {k: data[k] for k in named if k in data}

    @model_serializer(mode="wrap")
    def _in_dump_order(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        data = handler(self)
        return self._ordered(data, bool(info.by_alias)) if isinstance(data, dict) else data

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        # the schema of the fields (a serializer function alone has none), properties in dump order
        schema = handler(_without_serializer(core_schema))
        described = handler.resolve_ref_schema(schema)
        if isinstance(described.get("properties"), dict):
            described["properties"] = cls._ordered(described["properties"], by_alias=True)
        return schema


# ---- unit strings -------------------------------------------------------------------------

_TIME_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_SIZE_UNITS = {"tb": 1024**2, "gb": 1024, "mb": 1, "kb": 1 / 1024, "b": 1 / 1024**2}
_NUMBER_UNIT = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_duration(value: Any) -> Any:
    """``'1h'``, ``'30m'``, ``'2d'``, ``'10s'`` or a number of seconds -> whole seconds (ceil)."""
    if isinstance(value, bool):
        raise ValueError("a duration must be a number of seconds or a string like '30m', '1h', '2d'")
    if isinstance(value, int | float):
        return math.ceil(value)
    if isinstance(value, str):
        match = _NUMBER_UNIT.match(value)
        unit = match.group(2).lower() if match else ""
        if match and (unit in _TIME_UNITS or unit == ""):
            return math.ceil(float(match.group(1)) * _TIME_UNITS.get(unit, 1))
        raise ValueError(f'bad duration "{value}": supported units are d, h, m, s (e.g. "30m", "1.5h")')
    return value


def parse_size_mb(value: Any) -> Any:
    """``'8GB'``, ``'512mb'``, ``'1tb'`` or a number of MB -> whole MB (ceil, powers of 1024)."""
    if isinstance(value, bool):
        raise ValueError("a size must be a number of MB or a string like '512mb', '8GB'")
    if isinstance(value, int | float):
        return math.ceil(value)
    if isinstance(value, str):
        match = _NUMBER_UNIT.match(value)
        unit = match.group(2).lower() if match else ""
        if match and unit in _SIZE_UNITS:
            return math.ceil(float(match.group(1)) * _SIZE_UNITS[unit])
        if match and unit == "":
            return math.ceil(float(match.group(1)))
        raise ValueError(f'bad size "{value}": supported units are tb, gb, mb, kb, b (e.g. "8GB", "512mb")')
    return value


def parse_gpu_indices(value: Any) -> Any:
    """``1``, ``"0,1"`` or ``[0, 1]`` -> ``[0, 1]``; duplicates and negatives are refused."""
    if isinstance(value, bool):
        raise ValueError("GPU indices must be an int, a list of ints or a string like '0,1'")
    if isinstance(value, int):
        value = [value]
    elif isinstance(value, str):
        try:
            value = [int(part) for part in value.split(",") if part.strip()]
        except ValueError:
            raise ValueError(f'bad GPU indices "{value}": expected comma-separated integers like "0,1"') from None
    if isinstance(value, list):
        if any(not isinstance(i, int) or isinstance(i, bool) for i in value):
            raise ValueError(f"GPU indices must be integers, got {value!r}")
        if len(set(value)) != len(value):
            raise ValueError(f"duplicated GPU indices in {value}")
        if any(i < 0 for i in value):
            raise ValueError(f"negative GPU index in {value}")
    return value


def resolve_path(value: Any, info: ValidationInfo | None) -> Any:
    """Expand ``~`` and resolve a relative path against the config file's folder."""
    return resolve_against(value, base_dir_of(info))


def base_dir_of(info: ValidationInfo | None) -> str | None:
    """The folder of the config file being validated (None: the working directory)."""
    return (getattr(info, "context", None) or {}).get("base_dir")


def resolve_against(value: Any, base_dir: str | os.PathLike[str] | None) -> Any:
    """Expand ``~`` and resolve a relative path against ``base_dir`` (None: the working directory);
    a value that is no path is returned as it is."""
    if isinstance(value, str | os.PathLike):
        path = Path(os.path.expanduser(os.fspath(value)))
        if not path.is_absolute():
            path = Path(base_dir or os.getcwd()) / path
        return Path(os.path.realpath(path))
    return value


Duration = Annotated[int, BeforeValidator(parse_duration)]
SizeMB = Annotated[int, BeforeValidator(parse_size_mb)]
GpuIndices = Annotated[list[int], BeforeValidator(parse_gpu_indices)]
ConfigPath = Annotated[Path, BeforeValidator(resolve_path)]
Secret = SecretStr


# ---- error formatting ---------------------------------------------------------------------


_SECRET_NAME = re.compile(r"(password|passphrase|token|secret|accesskey|storagekey)", re.IGNORECASE)


def _path_text(loc: tuple[Any, ...]) -> tuple[str, str | None]:
    parts: list[str] = []
    suggestion: str | None = None
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
            continue
        text = str(item)
        if _SUGGEST in text:
            text, suggestion = text.split(_SUGGEST, 1)
        if text.startswith(("function-", "~", "chain[")):
            continue
        parts.append(("." if parts else "") + text)
    return "".join(parts) or "<top level>", suggestion


def _placeholder(value: Any) -> str | None:
    """The word of a placeholder such as NNI's examples have (``server: {your_nfs_server_ip}``), which
    YAML reads as ``{"your_nfs_server_ip": None}``; None for any other value."""
    if isinstance(value, dict) and len(value) == 1:
        ((key, item),) = value.items()
        if isinstance(key, str) and item is None:
            return key
    return None


def format_errors(exc: ValidationError) -> list[str]:
    """One readable message per pydantic error, each naming the field path and what is allowed."""
    problems: list[str] = []
    for err in exc.errors(include_url=False):
        path, suggestion = _path_text(tuple(err["loc"]))
        if err["type"] == "extra_forbidden":
            hint = f"; did you mean '{suggestion}'?" if suggestion else "; remove it or check its spelling"
            problems.append(f"{path}: unknown field{hint}")
            continue
        msg = err["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
        value = err.get("input")
        hidden = err["type"] == "missing" or isinstance(value, dict | list) or _SECRET_NAME.search(path)
        shown = "" if hidden else f" (got {value!r})"
        if err["type"] == "platform" and isinstance(value, dict):  # name the value given, not the section
            given = [v for k, v in value.items() if isinstance(k, str) and canonical_key(k) == "platform"]
            shown = f" (got {given[0]!r})" if given else " (no platform given)"
            from .plugins import platform_plugins  # loaded already: the tag was looked up among them

            msg += "".join(f", {name} (plugin)" for name in sorted(platform_plugins()))
        if err["type"] == "missing":
            msg = "is required but not set"
        elif (placeholder := _placeholder(value)) is not None and err["type"].endswith(("_type", "_parsing")):
            msg = (f"{{{placeholder}}} is still a placeholder (YAML reads a word in braces as a mapping): "
                   "write your value there")
        problems.append(f"{path}: {msg}{shown}")
    return problems
