"""What a tracker is told of a trial: its parameters and results as flat name -> value pairs.

Trackers take flat names and scalar values; a trial's parameters may nest (NNI's nested choices) and
its results may be a number (NNI's default metric) or a dict of them. Pure functions, no I/O.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

DEFAULT_METRIC = "default"  # NNI's name for a result given as a bare number
_UNSAFE = re.compile(r"[^\w\-. /:]")  # what MLflow refuses in a metric or parameter name


def safe_name(name: str) -> str:
    """``name`` with every character a tracker refuses replaced by ``_`` (never empty)."""
    return _UNSAFE.sub("_", name) or "_"


def numbers(result: Any) -> dict[str, float]:
    """A result's finite numeric values by name: a bare number as :data:`DEFAULT_METRIC`, a dict's
    numeric entries by their keys (nested dicts, strings, booleans, NaN and infinities left out)."""
    if isinstance(result, dict):
        found = {safe_name(str(k)): v for k, v in result.items()}
    else:
        found = {DEFAULT_METRIC: result}
    return {k: float(v) for k, v in found.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)}


def flat_parameters(parameters: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Parameters by ``/``-joined path, as the Optuna mirror names them: an NNI nested choice
    (``{"_name": option, ...}``) is the option's name under the choice's, its own parameters under
    ``<choice>/<option>/``; other dicts are walked; other values kept as they are."""
    out: dict[str, Any] = {}
    for key, value in parameters.items():
        name = f"{prefix}{safe_name(str(key))}"
        if isinstance(value, dict) and "_name" in value:
            option = str(value["_name"])
            out[name] = option
            out.update(flat_parameters({k: v for k, v in value.items() if k != "_name"},
                                       f"{name}/{safe_name(option)}/"))
        elif isinstance(value, dict):
            out.update(flat_parameters(value, f"{name}/"))
        else:
            out[name] = value
    return out


def as_text(value: Any) -> str:
    """A parameter's value as a tracker that takes text shows it (JSON for all but strings)."""
    return value if isinstance(value, str) else json.dumps(value, default=str)
