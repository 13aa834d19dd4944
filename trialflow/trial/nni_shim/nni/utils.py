"""``nni.utils``: the helpers NNI tuners, assessors and trial code import."""

from __future__ import annotations

from enum import Enum

TYPE_CHECKING = False  # typing stays unimported at run time: its import would cost every trial process
if TYPE_CHECKING:
    from typing import Any

__all__ = ["ClassArgsValidator", "MetricType", "OptimizeMode", "extract_scalar_history", "extract_scalar_reward",
           "merge_parameter"]


class OptimizeMode(Enum):
    Minimize = "minimize"
    Maximize = "maximize"


class MetricType:
    FINAL = "FINAL"
    PERIODICAL = "PERIODICAL"
    REQUEST_PARAMETER = "REQUEST_PARAMETER"


def extract_scalar_reward(value: Any, scalar_key: str = "default") -> float:
    """A number, or the ``scalar_key`` entry of a dict result; anything else is a RuntimeError (as NNI)."""
    if isinstance(value, (float, int)) and not isinstance(value, bool):
        return value
    if isinstance(value, dict) and scalar_key in value and isinstance(value[scalar_key], (float, int)):
        return value[scalar_key]
    raise RuntimeError(f"Incorrect final result: the final result should be float/int, or a dict which has a key "
                       f"named {scalar_key!r} whose value is float/int.")


def extract_scalar_history(trial_history: list[Any], scalar_key: str = "default") -> list[float]:
    return [extract_scalar_reward(value, scalar_key) for value in trial_history]


def merge_parameter(base_params: Any, override_params: dict[str, Any] | None) -> Any:
    """Update ``base_params`` (a dict or an argparse namespace) in place with ``override_params``;
    a key it lacks, or a value of another type, is an error (as NNI)."""
    if override_params is None:
        return base_params
    is_dict = isinstance(base_params, dict)
    for key, value in override_params.items():
        if is_dict:
            if key not in base_params:
                raise ValueError(f"Key '{key}' not found in base parameters.")
            current = base_params[key]
        else:
            if not hasattr(base_params, key):
                raise ValueError(f"Key '{key}' not found in base parameters.")
            current = getattr(base_params, key)
        if current is not None and type(current) is not type(value):
            raise TypeError(f"Expected '{key}' in override parameters to have type '{type(current)}', "
                            f"but found '{type(value)}'.")
        if is_dict:
            base_params[key] = value
        else:
            setattr(base_params, key, value)
    return base_params


class ClassArgsValidator:
    """Validates an algorithm's ``classArgs`` (``classArgsValidator`` of an ``algo register`` meta
    file): ``validate_class_args(**class_args)`` raises on a bad value."""

    def validate_class_args(self, **kwargs: Any) -> None:
        """Raise an exception naming the bad classArgs key (nothing to check by default)."""

    def choices(self, key: str, *args: Any) -> Any:
        """A check that ``key`` is one of ``args`` (a ``schema`` validator, as in NNI)."""
        return _check(lambda n: n in args, f"{key} should be in [{', '.join(map(str, args))}]!")

    def range(self, key: str, key_type: type, start: Any, end: Any) -> Any:
        """A check that ``key`` is a ``key_type`` within [start, end] (a ``schema`` validator)."""
        return _check(lambda n: isinstance(n, key_type) and start <= n <= end,
                      f"{key} should be {key_type.__name__} in range [{start}, {end}]!")


def _check(predicate: Any, error: str) -> Any:
    """``schema.And(predicate, error=...)`` when the ``schema`` package is there (NNI's validators
    use it); otherwise a callable that raises ValueError(error)."""
    try:
        from schema import And
    except ImportError:
        def check(value: Any) -> bool:
            if not predicate(value):
                raise ValueError(error)
            return True

        return check
    return And(predicate, error=error)
