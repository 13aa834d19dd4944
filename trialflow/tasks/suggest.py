"""The ``suggest_parameters`` task (one task run per trial, ``suggest-#<n>``): ask the experiment's
tuner for the next parameters and record the new trial, its parameters bound to it, in the store.
Also :func:`observe`, how trial tasks tell the tuner how a trial ended. Tuners are not thread-safe:
both serialise access."""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from ..experiments.context import ExperimentContext, get_context
from ..foundation.ids import new_trial_id
from ..tuners import InvalidMetric
from ..tuners.objectives import MultiResult, read_result


@task(name="suggest_parameters", cache_policy=NO_CACHE, task_run_name="suggest-#{number}")
def suggest_parameters(experiment_id: str, number: int) -> dict[str, Any] | None:
    """The next trial ``{"trial_id", "sequence", "parameter_id"}`` recorded in the store, or None when
    the tuner has nothing more to try. ``number`` names the task run: the sequence number the trial gets
    (counted from 0, as trials are)."""
    ctx = get_context(experiment_id)
    with ctx.tuner_lock:
        suggestion = ctx.tuner.suggest()
    if suggestion is None:
        return None
    trial_id = new_trial_id()
    record = ctx.store.add_trial(trial_id, None, suggestion.parameter_id, suggestion.parameters, suggestion.raw,
                                 str(ctx.experiment_dir / "trials" / trial_id))
    return {"trial_id": trial_id, "sequence": record.sequence, "parameter_id": suggestion.parameter_id}


def observe(ctx: ExperimentContext, parameter_id: int, final: Any, succeeded: bool,
            intermediate: list[float] | None = None) -> str | None:
    """Tell the tuner how a trial ended (its usable ``intermediate`` results first); returns why its
    result was invalid, if it was."""
    value: float | MultiResult | None = None
    problem = None
    if succeeded:
        if final is None:
            problem = "the trial reported no final result"
        else:
            try:
                value = read_result(final, ctx.config.multi_objective)
            except InvalidMetric as exc:
                problem = f"invalid final result: {exc}"
    with ctx.tuner_lock:
        raw = ctx.adopted.pop(parameter_id, None)
        if raw is not None:
            ctx.tuner.replay(parameter_id, raw, value)  # type: ignore[arg-type]  # MultiResult: see below
        else:
            if intermediate:
                ctx.tuner.intermediate_results(parameter_id, intermediate)
            # a MultiResult reaches only the tuners that take several objectives (checked at create)
            ctx.tuner.conclude(parameter_id, value, final, succeeded)  # type: ignore[arg-type]
    return problem
