"""The experiment's trial loop, inside its flow run: keeps at most ``trialConcurrency`` trials in
flight (a bounded window, re-read every tick so ``trialflow update concurrency`` applies at run time)
and, when the platform has a ``platformConcurrency`` cap, starts a trial only with a slot of that
Prefect global concurrency limit. Per trial it runs ``suggest_parameters`` (in the loop), then
``submit_trial`` and ``poll_trial`` (task runs of their own; the poll run starts when the submit run
has ended, failed or not). On resume it replays finished trials and imported results to the tuner,
re-attaches running trials and submits again those never submitted."""

from __future__ import annotations

import functools
import time
from dataclasses import replace
from typing import Any
from uuid import UUID

from prefect import get_run_logger
from prefect.futures import PrefectFuture
from prefect.utilities.annotations import allow_failure

from ..experiments import set_stored_fields
from ..experiments.context import ExperimentContext
from ..foundation.readable import wait_readable
from ..foundation.status import ExperimentStatus, TrialStatus
from ..platforms import TrialHandle, experiment_retry
from ..records.control_poke import ControlsWatch
from ..records.disk_space import NoSpaceLeft, no_space, out_of_space
from ..records.store import Control
from ..server.limits import PlatformCap
from ..tasks import poll_trial, submit_trial, suggest_parameters, upload_code
from ..tasks.retries import retry_options
from ..tuners import TunerError, create_tuner
from ..tuners.objectives import tuner_value
from .artifacts import ArtifactReporter
from .prefect_run_context import forget_task_runs
from .run_control import StopWatch, interrupt_fd

TICK_SECONDS = 0.25
# the longest wait between the loop's looks while nothing happens (no trial started or ended, the controls
# unchanged): it doubles from TICK_SECONDS after each such look. A trial's end, Ctrl-C and a control written to
# an embedded store (stop, kill, update: records.control_poke) wake it at once; a control written to a shared
# database is seen within this.
QUIET_TICK_SECONDS = 1.0
RESUBMITTED = "resubmitted after a restart: it was never submitted"
IMPORTED_IDS = -10**9  # parameter ids of imported data, apart from hand-picked trials' (-1 - sequence)


class _Loop:
    """State of one run of the experiment loop."""

    def __init__(self, ctx: ExperimentContext) -> None:
        self.ctx = ctx
        self.running: dict[str, PrefectFuture[Any]] = {}
        self.task_runs: dict[str, list[UUID]] = {}  # each running trial's task runs (suggest, submit, poll)
        self.exhausted = False
        controls = ctx.store.controls()
        self.elapsed_before = float(controls.get(Control.ELAPSED_SECONDS, 0.0))
        self.started = time.monotonic()
        self.reporter = ArtifactReporter(ctx)
        self.suggested = 0
        self.submit = submit_trial.with_options(**retry_options(experiment_retry(ctx.config)))
        self.capacity = ctx.service.capacity()
        self.cap: PlatformCap | None = None
        cap = ctx.service.concurrency_cap()
        if cap is not None:
            self.cap = PlatformCap(*cap).ensure()
            ctx.on_trial_end.append(self.cap.release)

    def elapsed(self) -> float:
        return self.elapsed_before + time.monotonic() - self.started

    def limits(self, controls: dict[str, Any]) -> tuple[int, int | None, float | None]:
        cfg = self.ctx.config
        return (int(controls.get(Control.TRIAL_CONCURRENCY, cfg.trial_concurrency)),
                controls.get(Control.MAX_TRIAL_NUMBER, cfg.max_trial_number),
                controls.get(Control.MAX_EXPERIMENT_DURATION, cfg.max_experiment_duration))

    def start(self, trial_id: str, submit: bool) -> None:
        """Submit (unless re-attached) and follow the trial, each in its own task run."""
        runs = self.task_runs.setdefault(trial_id, [])
        wait_for = None
        if submit:
            submitted = self.submit.submit(self.ctx.experiment_id, trial_id)
            runs.append(submitted.task_run_id)
            wait_for = [allow_failure(submitted)]
        future = poll_trial.submit(self.ctx.experiment_id, trial_id, wait_for=wait_for)  # type: ignore[call-overload]
        runs.append(future.task_run_id)
        self.running[trial_id] = future
        # The wrapped concurrent future answers locally; PrefectFuture.state asks the API every time.
        future.wrapped_future.add_done_callback(lambda _: self.ctx.free_slot())  # type: ignore[attr-defined]

    def in_flight(self) -> int:
        """Trials holding a slot of the window: started, and their end not yet recorded."""
        return sum(1 for t in self.running if t not in self.ctx.ended)

    def prune(self) -> bool:
        """Forget trials whose task run has closed, and what the flow run's context keeps of their task
        runs; whether there were any."""
        closed = [t for t, f in self.running.items() if f.wrapped_future.done()]  # type: ignore[attr-defined]
        for trial_id in closed:
            del self.running[trial_id]
            self.ctx.ended.discard(trial_id)
        if closed:
            forget_task_runs({run for trial_id in closed for run in self.task_runs.pop(trial_id, ())})
        return bool(closed)

    def close(self) -> None:
        if self.cap is not None:
            self.cap.close()


def run_trials(ctx: ExperimentContext) -> tuple[str, str | None]:
    """The experiment loop: (DONE, None), or (STOPPED, why) when asked to stop. Raises
    :class:`NoSpaceLeft` when a disk filled up (the trials are left running)."""
    loop = _Loop(ctx)
    watch = StopWatch()
    poked = ControlsWatch(ctx.store.url)
    wakers = [fd for fd in (ctx.slot_freed.fd, interrupt_fd(), poked.fd) if fd is not None]
    try:
        upload_code(ctx.experiment_id, str(ctx.service.code_directory()))
        resubmit = _reattach(ctx, loop)
        wait, seen_controls = TICK_SECONDS, None  # type: float, dict[str, Any] | None
        while True:
            if ctx.halted is None and (full := out_of_space(ctx.experiment_dir)) is not None:
                ctx.halt(full)
            if ctx.halted is not None:
                raise NoSpaceLeft.from_error(ctx.experiment_id, ctx.halted, str(ctx.experiment_dir))
            ctx.slot_freed.clear()  # before looking: a trial ending or a control written from here on wakes the wait
            poked.clear()
            controls = ctx.store.controls()
            acted = controls != seen_controls
            seen_controls = controls
            why = "stopped by trialflow stop" if controls.get(Control.STOP) else watch.reason()
            if why:
                return ExperimentStatus.STOPPED, why
            _raise_if_algorithm_failed(ctx)
            _apply_search_space(ctx, controls.get(Control.SEARCH_SPACE))
            for trial_id in controls.get(Control.KILL, []):
                if trial_id in loop.running:
                    ctx.request_cancel(trial_id, TrialStatus.USER_CANCELED)
            concurrency, max_trials, max_duration = loop.limits(controls)
            if acted:  # first look, or a control changed (update concurrency among them)
                ctx.service.follow_concurrency(concurrency)
            if loop.capacity is not None:
                concurrency = min(concurrency, loop.capacity)
            budget_over = max_duration is not None and loop.elapsed() >= max_duration
            while loop.in_flight() < concurrency and not budget_over and not loop.exhausted:
                total = ctx.store.count_trials()
                if not resubmit and max_trials is not None and total >= max_trials:
                    break
                if not _start_one(ctx, loop, resubmit):
                    break
                acted = True
            acted = loop.prune() or acted
            loop.reporter.maybe_update()
            total = ctx.store.count_trials()
            no_more = loop.exhausted or budget_over or (max_trials is not None and total >= max_trials)
            if not loop.running and no_more and not resubmit:
                return ExperimentStatus.DONE, None
            wait = TICK_SECONDS if acted else min(wait * 2, QUIET_TICK_SECONDS)
            if max_duration is not None and (left := max_duration - loop.elapsed()) > 0:
                wait = min(wait, left)  # the budget's end is seen when it comes
            wait_readable(wakers, wait)  # a trial's end, Ctrl-C, a control written
    except NoSpaceLeft:
        raise
    except Exception as exc:
        if no_space(exc) is None:
            raise
        ctx.halt(exc)  # before the stop below: the followers leave their trials running
        raise NoSpaceLeft.from_error(ctx.experiment_id, exc, str(ctx.experiment_dir)) from None
    finally:
        ctx.request_stop()
        for future in loop.running.values():
            future.wait()
        loop.close()
        poked.close()
        watch.close()
        if ctx.halted is None:
            ctx.store.set_control(Control.ELAPSED_SECONDS, loop.elapsed())
            loop.reporter.update(final=True)


def _raise_if_algorithm_failed(ctx: ExperimentContext) -> None:
    """A customized tuner or assessor that raised ends the experiment (ERROR, the reason as message)."""
    failure = ctx.tuner.failure or (ctx.assessor.failure if ctx.assessor is not None else None)
    if failure:
        raise TunerError(failure)


def _start_one(ctx: ExperimentContext, loop: _Loop, resubmit: list[Any]) -> bool:
    """Start one trial (a never-submitted one from before a resume first); False when none can start:
    the platform cap has no free slot, or the tuner has nothing more to try."""
    pending = f"pending-{loop.suggested}"
    if loop.cap is not None and not loop.cap.try_acquire(pending):
        return False
    if resubmit:
        trial_id = resubmit.pop(0).id
        ctx.store.note(trial_id, RESUBMITTED)
    else:
        suggestion = _suggest(ctx, loop)
        if suggestion is None:
            if loop.cap is not None:
                loop.cap.release(pending)
            return False
        trial_id = suggestion["trial_id"]
    if loop.cap is not None:
        loop.cap.rename(pending, trial_id)
    loop.start(trial_id, submit=True)
    return True


def _suggest(ctx: ExperimentContext, loop: _Loop) -> dict[str, Any] | None:
    """The next trial from the tuner, or None: then either it has nothing more (``loop.exhausted``)
    or it waits for running trials to end (a Hyperband round, a PBT generation)."""
    with ctx.tuner_lock:
        ready = ctx.tuner.can_suggest()
    if not ready:
        if loop.in_flight() == 0:  # nothing it waits for is running: it would wait forever
            get_run_logger().warning("the tuner waits for trials but none is running; the experiment ends")
            loop.exhausted = True
        return None
    loop.suggested += 1
    state = suggest_parameters(ctx.experiment_id, ctx.store.count_trials(), return_state=True)  # the sequence
    suggestion: dict[str, Any] | None = state.result()
    if suggestion is None:
        loop.exhausted = True
    elif state.state_details.task_run_id is not None:
        loop.task_runs[suggestion["trial_id"]] = [state.state_details.task_run_id]
    return suggestion


def _tell_tuner(ctx: ExperimentContext, skip_misfits: bool = False) -> None:
    """Tell the tuner the imported data and the finished trials, and reserve the live trials' ids.
    With ``skip_misfits`` (a changed search space), results whose values the tuner refuses are left out."""
    objectives = ctx.config.multi_objective
    history = [(IMPORTED_IDS - i, raw, tuner_value(value, objectives))
               for i, (_, raw, value) in enumerate(ctx.store.imported())]
    for trial in ctx.store.trials():
        if not trial.is_terminal or trial.stopping:  # a stop still to settle is told once it is
            ctx.tuner.reserve(trial.parameter_id)
            continue
        history.append((trial.parameter_id, trial.raw,
                        tuner_value(trial.final, objectives) if trial.status == TrialStatus.SUCCEEDED else None))
    for parameter_id, raw, value in history:
        try:
            ctx.tuner.replay(parameter_id, raw, value)  # type: ignore[arg-type]  # MultiResult: a tuner for it
        except Exception as exc:  # noqa: BLE001 -- only when skipping misfits: else it is raised
            if not skip_misfits:
                raise
            get_run_logger().info("result of parameter id %s left out: it does not fit the new search space (%s)",
                                  parameter_id, exc)


def _apply_search_space(ctx: ExperimentContext, space: Any) -> None:
    """``trialflow update searchspace``: later trials take their parameters from ``space`` (the tuner is
    rebuilt over it and told the results so far, as at a resume); running trials keep theirs. The stored
    config gets the new space, so a resume uses it too."""
    if space is None or space == ctx.config.search_space:
        return
    with ctx.tuner_lock:
        ctx.config = ctx.config.model_copy(update={"search_space": space})
        # a rebuilt customized tuner keeps the experiment's checkpoint folder; what it saved is not loaded again
        checkpoint = replace(ctx.checkpoint, resumed=False) if ctx.checkpoint is not None else None
        ctx.tuner = create_tuner(ctx.config.tuner, space, ctx.config.multi_objective,  # type: ignore[arg-type]
                                 checkpoint)
        _tell_tuner(ctx, skip_misfits=True)
    # the config file still says the old one: not an edit
    set_stored_fields(ctx.store, {"searchSpace": space}, remove=["searchSpaceFile"])
    get_run_logger().info("experiment %s: search space updated; later trials use it", ctx.experiment_id)


def _adopt_retried(trial_id: str, exc: Exception, delay: float) -> None:
    get_run_logger().warning("trial %s: re-attaching it failed (%s); retrying in %.0f s", trial_id, exc, delay)


def _reattach(ctx: ExperimentContext, loop: _Loop) -> list[Any]:
    """Tell the tuner the imported data and the finished trials, follow live ones -- and the trials
    whose stop a controller recorded but did not finish (it died before the kill was over), which are
    stopped again and settled; returns trials to submit again. Re-attaching a trial is retried on
    transient platform errors with the experiment's retry policy; raises the platform's error when it
    still fails."""
    _tell_tuner(ctx)
    resubmit = []
    retry = experiment_retry(ctx.config)  # re-attaching may ask the platform (a token): a 5xx is retried
    for trial in ctx.store.trials():
        if trial.is_terminal and not trial.stopping:
            continue
        if trial.stopping:
            ctx.request_cancel(trial.id, TrialStatus(trial.status))
        ctx.adopted[trial.parameter_id] = trial.raw
        if trial.handle is None:
            resubmit.append(trial)
        else:
            retry.call(functools.partial(ctx.service.adopt, TrialHandle.from_dict(trial.handle)),
                       functools.partial(_adopt_retried, trial.id))
            if loop.cap is not None and not loop.cap.try_acquire(trial.id):
                get_run_logger().warning("trial %s runs on beyond the %s cap (all slots were taken while the "
                                         "controller was away)", trial.id, loop.cap.name)
            loop.start(trial.id, submit=False)
    return resubmit
