"""Access to the experiment's tuner from the flow and the trial tasks: ``suggest`` one trial's
parameters, ``observe`` an outcome. Tuners are not thread-safe; these calls serialise access.

They are plain calls, not task runs of their own: a Prefect task run costs ~45 ms of CPU on this
2-core machine, and per-trial suggestion and submission are visible in the trial's task run.
"""

from __future__ import annotations

from typing import Any

from ..context import ExperimentContext
from ..tuners import InvalidMetric, Suggestion, extract_scalar


def suggest(ctx: ExperimentContext) -> Suggestion | None:
    """The next parameters, or None when the tuner has nothing more to try."""
    with ctx.tuner_lock:
        return ctx.tuner.suggest()


def observe(ctx: ExperimentContext, parameter_id: int, final: Any, succeeded: bool) -> str | None:
    """Tell the tuner how a trial ended; returns why its result was invalid, if it was."""
    value: float | None = None
    problem = None
    if succeeded:
        if final is None:
            problem = "the trial reported no final result"
        else:
            try:
                value = extract_scalar(final)
            except InvalidMetric as exc:
                problem = f"invalid final result: {exc}"
    with ctx.tuner_lock:
        raw = ctx.adopted.pop(parameter_id, None)
        if raw is not None:
            ctx.tuner.replay(parameter_id, raw, value)
        else:
            ctx.tuner.observe(parameter_id, value)
    return problem
