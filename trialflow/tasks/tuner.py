"""Prefect tasks around the tuner: ``suggest`` one trial's parameters, ``observe`` an outcome.

The tuner itself is a plain object (``trialflow.tuners``); these tasks only serialise access to it
(tuners are not thread-safe) and make each suggestion visible as a task run.
"""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from ..context import ExperimentContext
from ..tuners import InvalidMetric, Suggestion, extract_scalar


@task(name="suggest", cache_policy=NO_CACHE)
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
