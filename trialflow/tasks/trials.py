"""The trial tasks: ``submit_trial`` (``submit-<trial>``) hands one trial to its training service,
``poll_trial`` (``trial-<trial>``) follows it to the end.

``submit_trial`` builds the trial's spec from the store (its parameters were bound to it when it was
suggested), submits it and stores the handle; Prefect retries it on transient platform errors only,
with the platform's backoff (``trialflow.platforms.table``), and services make it idempotent.

``poll_trial`` stores metrics as they arrive, asks the assessor, enforces ``maxTrialDuration``,
honours cancel requests and the experiment's stop event, and records the trial's terminal status
exactly once -- cancels record their status (USER_CANCELED / EARLY_STOPPED) before the kill, so the
kill's exit code never overrides it. Its task run ends in a state mirroring the trial: Completed,
Failed (exit code and stderr tail as the message), Cancelled, or Cancelled named ``EarlyStopped``
(drawn apart from successes in the run graph). The trial's parameters, its output and a failure's
message go to the task run's logs.
The trial's slot is released as soon as its end is recorded, before the task run closes.

When the controller cannot go on but the trials can (a full disk: ``ExperimentContext.halt``), every
follower returns at once and leaves its trial as it is, WAITING or RUNNING (its task run Crashed), for
``trialflow resume`` to re-attach.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.states import Cancelled, Completed, Crashed, Failed, State

from ..experiments.context import ExperimentContext, FollowingHalted, get_context
from ..experiments.results import exited_by_itself
from ..foundation.status import ASSESSOR_STOP, DURATION_STOP
from ..platforms import (
    PlatformError,
    RetryPolicy,
    TransientPlatformError,
    TrialHandle,
    TrialStatus,
    TrialUpdate,
    experiment_retry,
)
from ..platforms.base import interruption_note, stored_attempt
from ..platforms.trial_output import TrialOutput, output_logger
from ..records.disk_space import no_space
from ..records.store import Metric
from ..tuners import scalar_or_none
from .retries import retry_options
from .suggest import observe

log = logging.getLogger("trialflow.trials")
TRANSIENT_POLL_LIMIT = 30


@task(name="submit_trial", cache_policy=NO_CACHE, task_run_name="submit-{trial_id}",
      **retry_options(RetryPolicy()))  # the flow applies its platform's policy with ``with_options``
def submit_trial(experiment_id: str, trial_id: str) -> dict[str, Any]:
    """Submit the stored trial ``trial_id``; returns its handle (also stored). Raises PlatformError
    when the experiment is stopping, no code was uploaded, or the platform refused the trial."""
    ctx = get_context(experiment_id)
    if ctx.stop.is_set():
        raise PlatformError("the experiment is stopping")
    if ctx.code is None:
        raise PlatformError("no code was uploaded for the experiment: run upload_code first")
    record = ctx.store.trial(trial_id)
    try:
        spec = ctx.service.trial_spec(experiment_id, trial_id, record.sequence, record.parameter_id,
                                      record.parameters)
        if ctx.desk is not None:  # it may report before its follower starts
            ctx.desk.follow(trial_id)
        handle = ctx.service.submit(spec, ctx.code)
    except PlatformError as exc:
        ctx.submit_errors[trial_id] = str(exc)
        if isinstance(exc, TransientPlatformError):
            log.warning("trial %s: submission failed (%s)", trial_id, exc)
        raise
    except OSError as exc:
        if no_space(exc) is not None:  # not the trial's failure: it stays WAITING, submitted again at resume
            ctx.halt(exc)
        raise
    ctx.submit_errors.pop(trial_id, None)
    stored = handle.to_dict()
    ctx.store.set_handle(trial_id, stored)
    log.debug("trial %s: submitted to %s with parameters %s", trial_id, handle.platform, record.parameters)
    # Returned with the stored record's id, a string object of its own: Prefect links each value of a
    # task's result to that task run by id(), so the caller's ``trial_id`` object in the result would
    # make a poll run created after this one returned (pool threads busy) read as fed by the submit run
    # rather than by the suggest run -- the run graph would depend on thread timing.
    return {**stored, "trial_id": record.id}


@task(name="poll_trial", cache_policy=NO_CACHE, task_run_name="trial-{trial_id}")
def poll_trial(experiment_id: str, trial_id: str) -> State:
    """Follow the trial (submitted, or re-attached from its stored handle) to its end; the task run's
    state mirrors the trial's. A trial whose submission failed is recorded FAILED here, and so is one
    whose following failed in a way nobody foresaw: no trial is left WAITING or RUNNING."""
    ctx = get_context(experiment_id)
    trial = ctx.store.trial(trial_id)
    output_logger().info("trial %s (#%d), parameters: %s", trial_id, trial.sequence,
                         json.dumps(trial.parameters, default=str))
    try:
        raw = trial.handle
        if ctx.halted is not None:
            raise FollowingHalted(trial_id)
        if raw is None:
            error = ctx.submit_errors.pop(trial_id, "it was never submitted")
            status = _end(ctx, trial_id, TrialUpdate(TrialStatus.FAILED, message=f"submission failed: {error}"), [])
        else:
            status = follow_trial(ctx, trial_id, TrialHandle.from_dict(raw))
    except Exception as exc:
        if isinstance(exc, FollowingHalted) or no_space(exc) is not None:
            ctx.halt(exc)
            why = ctx.halted or exc
            return Crashed(message=f"trial {trial_id} left as it was: the controller stopped "
                                   f"({no_space(why) or why}); resume re-attaches it")
        log.exception("trial %s: following it failed; it is stopped and recorded FAILED", trial_id)
        _stop_quietly(ctx, trial_id)
        status = _end(ctx, trial_id, TrialUpdate(TrialStatus.FAILED, message=(
            f"trialflow could not follow the trial ({type(exc).__name__}: {exc})")), [])
    finally:
        ctx.service.abandon(trial_id)  # whatever its end: a failed submission or poll holds no slot
        ctx.trial_ended(trial_id)
    return trial_state(ctx, trial_id, status)


def _stop_quietly(ctx: ExperimentContext, trial_id: str) -> None:
    """Kill a trial nobody follows any more (best effort: its record is what matters)."""
    try:
        raw = ctx.store.trial(trial_id).handle
        if raw is not None:
            ctx.service.cancel(TrialHandle.from_dict(raw), TrialStatus.SYS_CANCELED)
    except Exception as exc:  # noqa: BLE001
        log.warning("trial %s: could not stop it: %s", trial_id, exc)


def trial_state(ctx: ExperimentContext, trial_id: str, status: str) -> State:
    """The Prefect state mirroring a trial's terminal status (the UI's colours tell the story); a trial
    run again after interruptions says how many runs it took."""
    record = ctx.store.trial(trial_id)
    attempt = stored_attempt(record.handle)
    runs = f" ({attempt + 1} runs: {attempt} interrupted)" if attempt else ""
    message = record.message
    if status == TrialStatus.SUCCEEDED.value:
        return Completed(message=f"trial {trial_id} succeeded{runs}", data=status)
    if status == TrialStatus.EARLY_STOPPED.value:  # Cancelled-type: the run graph draws it apart from successes
        return Cancelled(name="EarlyStopped", message=message or "stopped early", data=status)
    if status in (TrialStatus.USER_CANCELED.value, TrialStatus.SYS_CANCELED.value):
        return Cancelled(message=f"{status}: {message or 'cancelled'}", data=status)
    failure = f"trial {trial_id} {status}{runs}: {message or ''}".strip()
    output_logger().error("%s", failure)  # with its real line breaks (Prefect's own lines quote it)
    return Failed(message=failure, data=status)


def follow_trial(ctx: ExperimentContext, trial_id: str, handle: TrialHandle) -> str:
    """Poll the trial until it ends; returns its recorded terminal status. Its output goes to this task
    run's logs meanwhile (:mod:`trialflow.platforms.trial_output`).

    A poll's terminal status is looked at before the assessor: a trial that has already ended keeps its
    own outcome (its exit code, its final result), the assessor only stops running trials, and never
    one whose final result is recorded (its work is done: it ends by itself). A trial seen ended
    without ever being seen RUNNING started after the poll before."""
    output = TrialOutput(ctx.service, handle, ctx.output_budget)
    try:
        return _follow(ctx, trial_id, handle, output)
    finally:
        output.pump(final=True)


def _follow(ctx: ExperimentContext, trial_id: str, handle: TrialHandle, output: TrialOutput) -> str:
    record = ctx.store.trial(trial_id)
    history = [m.value for m in ctx.store.metrics(trial_id, "PERIODICAL")]
    cursor: dict[str, Any] = {}
    transient = 0
    last_seen = record.start_time or time.time()  # the trial had not ended by then
    final_in = record.final is not None
    unassessed = False  # intermediate results that arrived and the assessor is still to see
    if ctx.desk is not None:
        ctx.desk.follow(trial_id)
    quiet_max = ctx.service.quiet_poll_seconds
    wakeup = ctx.follower_wakeup(trial_id) if quiet_max else None
    interval = ctx.poll_interval
    while True:
        reason = _cancel_reason(ctx, trial_id, record.start_time)
        if ctx.halted is not None:  # looked at after: the stop that follows a halt never cancels the trial
            raise FollowingHalted(trial_id)
        if reason is not None:
            output.stopped = True
            ended, cursor = _cancel(ctx, trial_id, handle, reason, cursor, history, record.start_time is not None,
                                    record.stopping)
            if ended is not None:
                return ended
            output.stopped, final_in = False, True  # the assessor's stop, dropped: the final result came in
            continue
        polled_at = time.time()
        try:
            update = ctx.service.poll(handle, cursor)
            transient = 0
        except Exception as exc:  # noqa: BLE001 -- whatever happens, the trial must not stay RUNNING
            if no_space(exc) is not None:  # the controller's disk, not the trial: poll_trial halts
                raise
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
        output.pump()
        absorbed = _absorb(ctx, trial_id, update, history)
        final_in = final_in or any(r.type == "FINAL" for r in update.metrics)
        # a trial whose final result is in is judged no more: results after it are owed no look, and
        # its asks about them are answered at once (else it would wait on the desk until its ask times out)
        unassessed = (absorbed or unassessed) and not final_in
        if update.interrupted is not None:
            resubmitted = _resubmit(ctx, trial_id, handle, update.interrupted)
            if isinstance(resubmitted, TrialUpdate):
                return _end(ctx, trial_id, resubmitted, history, absorbed=True)
            handle = output.handle = resubmitted
            cursor = {}
            continue
        if update.status.is_terminal:
            if record.start_time is None and _ran(update, history):
                ctx.store.set_started(trial_id, last_seen)
            return _end(ctx, trial_id, update, history, absorbed=True)
        quiet = update.status == TrialStatus.RUNNING and record.start_time is not None and not update.metrics
        if update.status == TrialStatus.RUNNING and record.start_time is None:
            ctx.store.set_status(trial_id, TrialStatus.RUNNING, when=polled_at)
            record.start_time = polled_at
            log.debug("trial %s: running", trial_id)
        last_seen = polled_at
        # results that came while the trial was not yet seen running are assessed once it is: one
        # reported at once and followed by a long step was never assessed before its next report
        if unassessed and update.status == TrialStatus.RUNNING and ctx.assessor is not None:
            unassessed = False
            values = _assessed(ctx, history)
            judged = ctx.assessor.multi_objective or all(v is not None for v in values)  # it skips unusable ones
            if judged and ctx.assessor.assess(trial_id, values):
                log.debug("trial %s: the assessor stops it after %d intermediate results", trial_id, len(values))
                if ctx.desk is not None:  # it takes no further step while its stop is recorded and sent
                    ctx.desk.answer(trial_id, len(history) - 1, stop=True)
                ctx.request_cancel(trial_id, TrialStatus.EARLY_STOPPED)
                continue
        if ctx.desk is not None and not unassessed:
            _answer_asks(ctx, trial_id, history, final_in)
        interval = _next_wait(ctx, interval if quiet else None, quiet_max, record.start_time)
        if ctx.desk is None or not ctx.desk.wait(trial_id, interval):
            if wakeup is None:
                ctx.service.wait(handle, interval)
            else:
                ctx.service.wait_or_woken(handle, interval, wakeup.fd)
                wakeup.clear()


def _next_wait(ctx: ExperimentContext, quiet_for: float | None, quiet_max: float | None,
               start_time: float | None) -> float:
    """Seconds to wait before the next poll: the poll interval; after a quiet poll (running, nothing new;
    ``quiet_for``: the wait before it), where the service's wait wakes on a cancel or stop (``quiet_max``
    set), twice the last wait up to ``quiet_max``, ending by the trial's ``maxTrialDuration``."""
    wait = ctx.poll_interval
    if quiet_for is not None and quiet_max:
        wait = max(wait, min(quiet_for * 2, quiet_max))
        if ctx.max_trial_duration and start_time:  # a longer wait ends by the trial's time limit
            wait = max(ctx.poll_interval, min(wait, start_time + ctx.max_trial_duration - time.time()))
    return wait


def _answer_asks(ctx: ExperimentContext, trial_id: str, history: list[Any], final_in: bool) -> None:
    """Tell a trial waiting at the report desk to go on (its results so far are judged), and at which
    result its assessor may stop it next (intermediate result ``n`` has sequence ``n - 1``)."""
    assert ctx.desk is not None and ctx.assessor is not None
    step = ctx.assessor.next_decision(len(history)) if not final_in else None
    ctx.desk.answer(trial_id, len(history) - 1, stop=False, next_ask=None if step is None else step - 1)


def _resubmit(ctx: ExperimentContext, trial_id: str, handle: TrialHandle, why: str) -> TrialHandle | TrialUpdate:
    """An infrastructure event ended the trial's run (its platform said so, within the section's
    ``maxInterruptions``): whatever is left of that run is cancelled and the trial is submitted again
    with the same parameters, as attempt n + 1 (stored in the handle before this returns, so a resumed
    controller follows the new run), its intermediate results numbered on after those stored. The
    interruption is an event of the trial's history; the tuner and assessor are not told. Returns the
    new handle, or the FAILED update when the new submission fails for good."""
    attempt = int(handle.data.get("attempt", 0)) + 1
    log.warning("trial %s: %s; not the trial's failure: resubmitting it with the same parameters (interruption "
                "%d)", trial_id, why, attempt)
    output_logger().warning("trial %s: %s; resubmitted with the same parameters (interruption %d)", trial_id, why,
                            attempt)
    try:
        ctx.service.cancel(handle, TrialStatus.SYS_CANCELED)
    except PlatformError as exc:  # the new run goes ahead; the platform names each run apart
        log.warning("trial %s: what is left of the interrupted run was not cancelled: %s", trial_id, exc)
    record = ctx.store.trial(trial_id)
    reported = max((m.sequence for m in ctx.store.metrics(trial_id, "PERIODICAL")), default=-1) + 1

    def submit() -> TrialHandle:
        spec = ctx.service.trial_spec(ctx.experiment_id, trial_id, record.sequence, record.parameter_id,
                                      record.parameters)
        return ctx.service.submit(dataclasses.replace(spec, attempt=attempt, reported=reported),
                                  ctx.code)  # type: ignore[arg-type]

    try:
        fresh = experiment_retry(ctx.config).call(submit)
    except PlatformError as exc:
        return TrialUpdate(TrialStatus.FAILED, message=f"{why}; resubmitting it failed: {exc}")
    fresh = TrialHandle(fresh.trial_id, fresh.platform, {**fresh.data, "attempt": attempt})
    ctx.store.set_handle(trial_id, fresh.to_dict())
    ctx.store.note(trial_id, interruption_note(attempt, why))
    return fresh


def _ran(update: TrialUpdate, history: list[Any]) -> bool:
    """Whether an ended trial had started: it exited (with any code), succeeded or reported."""
    return update.exit_code is not None or update.status == TrialStatus.SUCCEEDED or bool(history or update.metrics)


def _cancel_reason(ctx: ExperimentContext, trial_id: str, start_time: float | None) -> TrialStatus | None:
    if trial_id in ctx.cancel_requests:
        return ctx.cancel_requests[trial_id]
    if ctx.stop.is_set():
        return TrialStatus.USER_CANCELED
    if ctx.max_trial_duration and start_time and time.time() - start_time > ctx.max_trial_duration:
        return TrialStatus.EARLY_STOPPED
    return None


def _cancel(ctx: ExperimentContext, trial_id: str, handle: TrialHandle, reason: TrialStatus,
            cursor: dict[str, Any], history: list[Any], started: bool, resumed: bool
            ) -> tuple[str | None, dict[str, Any]]:
    """Stop the trial; returns its recorded status (None: it was not stopped, follow it on) and the
    metric cursor. A started trial that has ended by itself since the last poll keeps its own outcome
    (a trial not seen started is not polled first: a poll may start it). One whose final result is
    recorded by now is not stopped by the assessor (the request is dropped); stopped at its
    ``maxTrialDuration``, it keeps that result as SUCCEEDED.
    Otherwise the stop is recorded first (so the kill's exit code never reads as the trial's own
    failure, even if this process dies now), then the kill, then the metrics written before it are
    collected and the record is settled: the end time after them, the exit code, and -- when the trial
    turns out to have exited by itself before the kill landed -- its own outcome instead of the stop.
    A stop recorded by a controller that died before settling it (:attr:`TrialRecord.stopping`) is
    finished the same way (``resumed``): killed again unless it has ended, its metrics collected, settled."""
    polled_at = time.time()
    try:
        update = ctx.service.poll(handle, cursor) if started or history or resumed else None
    except Exception:  # noqa: BLE001 -- the stop goes ahead; its final poll collects what this one missed
        update = None
    if update is not None:
        cursor = update.cursor
        _absorb(ctx, trial_id, update, history)
        if update.status.is_terminal and not resumed:
            if _ran(update, history):
                ctx.store.set_started(trial_id, polled_at)
            return _end(ctx, trial_id, update, history, absorbed=True), cursor
    record = ctx.store.trial(trial_id)  # after the poll: a final result it brought counts
    if resumed:
        recorded, message = True, record.message or reason.value
        final_in = message == DURATION_STOP and record.final is not None
    else:
        by_assessor = ctx.cancel_requests.get(trial_id) == TrialStatus.EARLY_STOPPED
        final_in = reason == TrialStatus.EARLY_STOPPED and record.final is not None
        if final_in and by_assessor:
            del ctx.cancel_requests[trial_id]
            return None, cursor
        message = {TrialStatus.EARLY_STOPPED: ASSESSOR_STOP if by_assessor else DURATION_STOP,
                   TrialStatus.USER_CANCELED: "cancelled by the user"}.get(reason, reason.value)
        recorded = ctx.store.record_stop(trial_id, reason.value, message)
    after = update if update is not None and update.status.is_terminal else _kill(ctx, trial_id, handle, reason,
                                                                                  cursor, history)
    status, code = reason, None
    if after is not None and after.status.is_terminal:
        code = after.exit_code
        if exited_by_itself(code):
            status = TrialStatus.SUCCEEDED if code == 0 else TrialStatus.FAILED
            message = after.message or message
    if final_in and status == reason:  # stopped at its limit after its work was done: the kill is not its exit
        status, code, message = TrialStatus.SUCCEEDED, None, f"{DURATION_STOP} after its final result"
    if recorded:
        if code is not None or _ran(after or TrialUpdate(reason), history):
            ctx.store.set_started(trial_id, polled_at)  # it had not ended then, and may not have started
        ctx.store.settle(trial_id, status.value, code, message)
        _finish_tuning(ctx, trial_id, history, succeeded=status == TrialStatus.SUCCEEDED)
    return ctx.store.trial(trial_id).status, cursor


def _kill(ctx: ExperimentContext, trial_id: str, handle: TrialHandle, reason: TrialStatus, cursor: dict[str, Any],
          history: list[Any]) -> TrialUpdate | None:
    """Kill the trial, then take in the metrics it wrote before the kill; returns that last poll (None
    when it failed)."""
    ctx.service.cancel(handle, reason)
    try:
        after = ctx.service.poll(handle, cursor)
    except PlatformError as exc:  # the status is recorded; only metrics written in the last moments are missed
        log.warning("trial %s: metrics written just before the cancel could not be read: %s", trial_id, exc)
        return None
    _absorb(ctx, trial_id, after, history)
    return after


def _absorb(ctx: ExperimentContext, trial_id: str, update: TrialUpdate, history: list[Any]) -> bool:
    """Store the update's metrics; True when new intermediate results arrived."""
    for error in update.errors:
        log.warning("trial %s: rejected metric data: %s", trial_id, error)
    if not update.metrics:
        return False
    now = time.time()
    ctx.store.add_metrics(Metric(trial_id, r.type, r.sequence, r.value, now) for r in update.metrics)
    if log.isEnabledFor(logging.DEBUG):
        for r in update.metrics:
            log.debug("trial %s: %s result #%d: %s", trial_id, r.type.lower(), r.sequence, r.value)
    fresh = False
    for r in update.metrics:
        if r.type == "PERIODICAL" and r.sequence >= len(history):
            history.append(r.value)
            fresh = True
    return fresh


def _end(ctx: ExperimentContext, trial_id: str, update: TrialUpdate, history: list[Any],
         absorbed: bool = False) -> str:
    """Record the trial's own terminal status (once) and tell the tuner and assessor."""
    if not absorbed:
        _absorb(ctx, trial_id, update, history)
    if ctx.store.set_status(trial_id, update.status.value, update.exit_code, update.message):
        log.debug("trial %s: %s (exit code %s)%s", trial_id, update.status.value, update.exit_code,
                  f": {update.message}" if update.message else "")
        _finish_tuning(ctx, trial_id, history, succeeded=update.status == TrialStatus.SUCCEEDED)
    return ctx.store.trial(trial_id).status


def _finish_tuning(ctx: ExperimentContext, trial_id: str, history: list[Any], succeeded: bool) -> None:
    trial = ctx.store.trial(trial_id)
    values = [v for v in (scalar_or_none(x) for x in history) if v is not None]
    problem = observe(ctx, trial.parameter_id, trial.final, succeeded, values)
    if problem and succeeded:
        log.warning("trial %s: %s; the tuner treats it as failed, the experiment goes on", trial_id, problem)
    if ctx.assessor is not None:
        ctx.assessor.trial_end(trial_id, values, succeeded)


def _assessed(ctx: ExperimentContext, history: list[Any]) -> list[Any]:
    """The intermediate results as the assessor reads them: numbers (NNI's rule), or for one that takes
    several objectives :class:`~trialflow.tuners.objectives.MultiResult` values; None where one is unusable."""
    objectives = ctx.config.multi_objective
    if ctx.assessor is not None and ctx.assessor.multi_objective and objectives is not None:
        return [objectives.read_intermediate(v) for v in history]
    return [scalar_or_none(v) for v in history]
