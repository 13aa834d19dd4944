"""The trial task: one Prefect task run per trial (``trial-<id>-#<sequence>``) that submits the trial
to its training service and follows it to the end.

Submission is retried with exponential backoff on :class:`TransientPlatformError` only; services
make it idempotent. Following stores metrics as they arrive, asks the assessor, enforces
``maxTrialDuration``, honours cancel requests and the experiment's stop event, and records the
trial's terminal status exactly once -- cancels record their status (USER_CANCELED /
EARLY_STOPPED) before the kill, so the kill's exit code never overrides it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from ..context import ExperimentContext
from ..platforms import (
    CodeRef,
    PlatformError,
    TransientPlatformError,
    TrialHandle,
    TrialSpec,
    TrialStatus,
    TrialUpdate,
)
from ..store import Metric
from ..tuners import scalar_or_none
from .tuner import observe

log = logging.getLogger("trialflow.trials")
TRANSIENT_POLL_LIMIT = 30
SUBMIT_ATTEMPTS = 5


def submit_with_retries(ctx: ExperimentContext, spec: TrialSpec, code: CodeRef) -> TrialHandle:
    """Submit, retrying transient platform errors (1, 2, 4, 8 s apart); store the handle."""
    for attempt in range(SUBMIT_ATTEMPTS):
        try:
            handle = ctx.service.submit(spec, code)
            break
        except TransientPlatformError as exc:
            if attempt == SUBMIT_ATTEMPTS - 1 or ctx.stop.is_set():
                raise PlatformError(f"submission kept failing: {exc}") from None
            log.warning("trial %s: submission failed (%s); retrying", spec.trial_id, exc)
            time.sleep(2**attempt)
    ctx.store.set_handle(spec.trial_id, handle.to_dict())
    return handle


@task(name="trial", cache_policy=NO_CACHE, task_run_name="trial-{trial_id}-#{sequence}")
def run_trial(ctx: ExperimentContext, trial_id: str, sequence: int, spec: TrialSpec | None,
              handle: TrialHandle | None, code: CodeRef) -> str:
    """Submit ``spec`` (or re-attach ``handle``) and follow the trial; returns its terminal status.
    The trial's slot is released as soon as its end is recorded, before the task run closes."""
    try:
        if handle is None:
            assert spec is not None
            try:
                handle = submit_with_retries(ctx, spec, code)
            except PlatformError as exc:
                return _end(ctx, trial_id, TrialUpdate(TrialStatus.FAILED, message=f"submission failed: {exc}"), [])
        return follow_trial(ctx, trial_id, handle)
    finally:
        ctx.trial_ended(trial_id)


def follow_trial(ctx: ExperimentContext, trial_id: str, handle: TrialHandle) -> str:
    record = ctx.store.trial(trial_id)
    history = [m.value for m in ctx.store.metrics(trial_id, "PERIODICAL")]
    cursor: dict[str, Any] = {}
    transient = 0
    while True:
        reason = _cancel_reason(ctx, trial_id, record.start_time)
        if reason is not None:
            return _cancel(ctx, trial_id, handle, reason, cursor, history)
        try:
            update = ctx.service.poll(handle, cursor)
            transient = 0
        except Exception as exc:  # noqa: BLE001 -- whatever happens, the trial must not stay RUNNING
            if isinstance(exc, PlatformError) and not isinstance(exc, TransientPlatformError):
                return _end(ctx, trial_id, TrialUpdate(TrialStatus.FAILED, message=str(exc)), history)
            if not isinstance(exc, TransientPlatformError):
                log.warning("trial %s: polling failed (%s: %s); retrying", trial_id, type(exc).__name__, exc)
            transient += 1
            if transient >= TRANSIENT_POLL_LIMIT:
                return _end(ctx, trial_id, TrialUpdate(TrialStatus.FAILED, message=f"platform unreachable: {exc}"),
                            history)
            time.sleep(min(5.0, 0.2 * 2**min(transient, 5)))
            continue
        cursor = update.cursor
        if _absorb(ctx, trial_id, update, history) and ctx.assessor is not None:
            values = [scalar_or_none(v) for v in history]
            if all(v is not None for v in values) and ctx.assessor.assess(trial_id, values):  # type: ignore[arg-type]
                ctx.request_cancel(trial_id, TrialStatus.EARLY_STOPPED)
                continue
        if update.status == TrialStatus.RUNNING and record.start_time is None:
            ctx.store.set_status(trial_id, "RUNNING")
            record.start_time = time.time()
        if update.status.is_terminal:
            return _end(ctx, trial_id, update, history)
        ctx.service.wait(handle, ctx.poll_interval)


def _cancel_reason(ctx: ExperimentContext, trial_id: str, start_time: float | None) -> TrialStatus | None:
    if trial_id in ctx.cancel_requests:
        return ctx.cancel_requests[trial_id]
    if ctx.stop.is_set():
        return TrialStatus.USER_CANCELED
    if ctx.max_trial_duration and start_time and time.time() - start_time > ctx.max_trial_duration:
        return TrialStatus.EARLY_STOPPED
    return None


def _cancel(ctx: ExperimentContext, trial_id: str, handle: TrialHandle, reason: TrialStatus,
            cursor: dict[str, Any], history: list[Any]) -> str:
    """Record the cancel status first, then kill, then collect metrics written before the end."""
    message = {TrialStatus.EARLY_STOPPED: "stopped early (assessor or maxTrialDuration)",
               TrialStatus.USER_CANCELED: "cancelled by the user"}.get(reason, reason.value)
    recorded = ctx.store.set_status(trial_id, reason.value, message=message)
    ctx.service.cancel(handle, reason)
    try:
        _absorb(ctx, trial_id, ctx.service.poll(handle, cursor), history)
    except PlatformError:
        pass
    if recorded:
        _finish_tuning(ctx, trial_id, history, succeeded=False)
    return ctx.store.trial(trial_id).status


def _absorb(ctx: ExperimentContext, trial_id: str, update: TrialUpdate, history: list[Any]) -> bool:
    """Store the update's metrics; True when new intermediate results arrived."""
    for error in update.errors:
        log.warning("trial %s: rejected metric data: %s", trial_id, error)
    if not update.metrics:
        return False
    now = time.time()
    ctx.store.add_metrics(Metric(trial_id, r.type, r.sequence, r.value, now) for r in update.metrics)
    fresh = False
    for r in update.metrics:
        if r.type == "PERIODICAL" and r.sequence >= len(history):
            history.append(r.value)
            fresh = True
    return fresh


def _end(ctx: ExperimentContext, trial_id: str, update: TrialUpdate, history: list[Any]) -> str:
    _absorb(ctx, trial_id, update, history)
    if ctx.store.set_status(trial_id, update.status.value, update.exit_code, update.message):
        _finish_tuning(ctx, trial_id, history, succeeded=update.status == TrialStatus.SUCCEEDED)
    return ctx.store.trial(trial_id).status


def _finish_tuning(ctx: ExperimentContext, trial_id: str, history: list[Any], succeeded: bool) -> None:
    trial = ctx.store.trial(trial_id)
    problem = observe(ctx, trial.parameter_id, trial.final, succeeded)
    if problem and succeeded:
        log.warning("trial %s: %s; the tuner treats it as failed, the experiment goes on", trial_id, problem)
    if ctx.assessor is not None:
        values = [v for v in (scalar_or_none(x) for x in history) if v is not None]
        ctx.assessor.trial_end(trial_id, values, succeeded)
