"""The experiment flow: one Prefect flow run per experiment (run name = experiment id), built only
from the task library (``trialflow.tasks``).

The loop keeps at most ``trialConcurrency`` trials in flight (a bounded window, re-read every tick so
``trialflow update concurrency`` applies at run time) and, when the platform has a
``platformConcurrency`` cap, starts a trial only with a slot of that Prefect global concurrency
limit. Per trial it runs ``suggest_parameters`` (in the loop), then ``submit_trial`` and
``poll_trial`` (task runs of their own; the poll run starts when the submit run has ended, failed or
not). ``upload_code`` runs once. It ends DONE when the budget (``maxTrialNumber``,
``maxExperimentDuration``, or a finished grid) is spent and every trial has ended, STOPPED on
``trialflow stop``, a cancelled flow run (asked of Prefect every few seconds: no worker may be there
to kill it) or Ctrl-C in a foreground terminal (running trials are cancelled as USER_CANCELED; the
run ends Cancelled), ERROR when the service or tuner cannot go on. The run is named by the experiment
id and tagged once the id is known; a retried run resumes the experiment it created. A failed trial
never fails the flow run; a run in which trials ran and none succeeded ends Failed (the experiment
stays DONE, as in NNI).

Resume (the same flow on an existing experiment id): finished trials are replayed to the tuner,
running trials are re-attached through their stored handles, trials that were never submitted are
submitted again with their original parameters; ``maxTrialNumber`` keeps counting every trial.
Parameters of the flow are ids and paths only: secrets never become flow parameters.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from uuid import UUID

from prefect import flow, get_run_logger, tags
from prefect.context import FlowRunContext, TagsContext
from prefect.exceptions import Abort, CancelledRun, TerminationSignal
from prefect.futures import PrefectFuture
from prefect.states import Cancelled, Completed, Failed, State
from prefect.task_runners import ThreadPoolTaskRunner
from prefect.utilities.annotations import allow_failure

from ..config import load_config
from ..context import ExperimentContext, open_context
from ..disk_space import NoSpaceLeft, no_space, out_of_space
from ..experiments import (
    find_experiment,
    load_experiment_config,
    open_store,
    set_stored_fields,
)
from ..ids import new_experiment_id
from ..kept_server import ServerError
from ..limits import PlatformCap
from ..platforms import TrialHandle, experiment_retry
from ..results import end_experiment, nothing_succeeded, outcome_line
from ..status import ExperimentStatus, TrialStatus
from ..store import Control, ExperimentStore
from ..tasks import poll_trial, submit_trial, suggest_parameters, upload_code
from ..tasks.retries import retry_options
from ..tracking import tracking
from ..tuners import TunerError, create_tuner
from ..tuners.objectives import tuner_value
from ..warm_start import create_warm_started
from ..withheld import withhold
from .artifacts import ArtifactReporter
from .events import ExperimentEvents
from .prefect_run_context import forget_task_runs
from .run_api import experiment_api
from .run_control import (
    StopWatch,
    end_flow_run,
    label_run,
    retried_experiment,
    run_tags,
    signal_of,
    stop_reason,
    stored_run_tags,
)
from .run_log import controller_log
from .temporary_server import guard_temporary_servers

TICK_SECONDS = 0.25
RESUBMITTED = "resubmitted after a restart: it was never submitted"
MAX_THREADS = 1024  # the window, not the pool, bounds concurrency (it may grow at run time)
IMPORTED_IDS = -10**9  # parameter ids of imported data, apart from hand-picked trials' (-1 - sequence)


_CHOSEN_IDS: dict[str, str] = {}  # flow run id -> the id its new experiment will have (named after it)


def _run_name() -> str:
    """The run's name, the experiment's id: the one it runs, or, for a new experiment, the id chosen
    here for it (so that its first log lines, a worker's among them, already name it)."""
    from prefect.runtime import flow_run

    params = flow_run.parameters
    if params.get("experiment_id"):
        return str(params["experiment_id"])
    chosen = _CHOSEN_IDS[str(flow_run.id)] = new_experiment_id()
    return chosen


def _chosen_id() -> str | None:
    """The id :func:`_run_name` chose for this run's new experiment, if it did."""
    context = FlowRunContext.get()
    return _CHOSEN_IDS.pop(str(context.flow_run.id), None) if context and context.flow_run else None


@flow(name="experiment", flow_run_name=_run_name, task_runner=ThreadPoolTaskRunner(max_workers=MAX_THREADS),  # type: ignore[arg-type]
      validate_parameters=False)
def experiment_flow(config_path: str | None = None, experiment_id: str | None = None,
                    working_directory: str | None = None, overrides: dict[str, Any] | None = None) -> State:
    """Run a new experiment from ``config_path``, or run/resume the stored ``experiment_id`` (found
    under ``working_directory`` or the known roots) with its own stored config: a ``config_path`` given
    with it must describe the same experiment (``ConfigMismatch`` otherwise, the experiment untouched).
    ``overrides`` (config fields, as in the file: ``{"trialConcurrency": 4}``) change a new
    experiment's config before it is validated, as a deployment run's parameter; a stored
    experiment's are changed with ``trialflow update`` instead (``ValueError``).

    The run's state carries the final status (DONE, STOPPED) as its result. It is Completed, or Failed
    when the experiment ran trials and none succeeded (the message counts them); a run that cannot go
    on raises, the experiment recorded ERROR (or STOPPED when the run was cancelled)."""
    logger = get_run_logger()
    guard_temporary_servers()  # a SIGKILLed controller must not leave its temporary server running
    chosen_id = _chosen_id()  # the run is named after it: a new experiment takes it
    given = None
    if experiment_id is not None and overrides:
        raise ValueError(f"overrides apply to a new experiment; change experiment {experiment_id}'s settings "
                         "with `trialflow update` instead")
    if experiment_id is None:
        experiment_id = retried_experiment()  # Prefect's Retry of a run that created one resumes it
        if experiment_id is not None:  # with its overrides, stored at its creation
            logger.info("this run is a retry: it resumes experiment %s", experiment_id)
    if experiment_id is None:
        if not config_path:
            raise ValueError("give config_path (new experiment) or experiment_id (existing one)")
        config_path = os.path.abspath(config_path)
        experiment_id, exp_dir = create_warm_started(load_config(config_path, overrides), config_path,
                                                     overridden=overrides or (), experiment_id=chosen_id)
        root = exp_dir.parent
    else:
        given = load_config(config_path) if config_path else None  # may hold a shared store's password
        root = Path(working_directory).resolve() if working_directory else find_experiment(experiment_id)[0]
    store = open_store(root, experiment_id, given)
    exp_dir = root / experiment_id
    with ExitStack() as stack:
        # the run's tags stay on the run: a tagged task run takes a tag concurrency lease from the API
        # (a round trip per task run, and a stall while the API is gone)
        stack.enter_context(TagsContext(current_tags=set()))
        stack.enter_context(controller_log(exp_dir))
        config = load_experiment_config(store, config_path, given)  # refuses another experiment's config first
        withhold(config, config_path or store.experiment().config_path)  # out of the code bundles
        previous = store.experiment()  # a resumed experiment's earlier run
        flow_run_id = label_run(experiment_id, run_tags(experiment_id, config))
        if previous.flow_run_id and previous.flow_run_id != flow_run_id and previous.prefect_api \
                and previous.prefect_api == _configured_api():
            # its controller is gone (resume refuses a live one): that run would say Running for ever
            end_flow_run(previous.flow_run_id, previous.prefect_api, f"experiment {experiment_id}: its controller "
                         f"ended without ending this run; the experiment goes on in run {flow_run_id}", crashed=True)
        # recorded at once: `create` prints the run's UI page as soon as it is known
        store.set_experiment(flow_run_id=flow_run_id, prefect_api=_configured_api())
        events = ExperimentEvents(experiment_id, store, config)
        try:
            ctx = stack.enter_context(open_context(experiment_id, exp_dir, config, store))
            # finished before the context closes: the service reads the last trials' logs for it
            tracker = stack.enter_context(tracking(experiment_id, exp_dir, config, store, ctx.service))
        except Exception as exc:
            logger.error("experiment %s could not start: %s", experiment_id, exc)  # in experiment.log too
            end_experiment(store, ExperimentStatus.ERROR, str(exc))
            events.experiment_ended(ExperimentStatus.ERROR, str(exc))
            raise
        ctx.on_trial_end.append(events.trial_ended)
        if tracker is not None:
            ctx.on_trial_end.append(tracker.trial_ended)
        store.set_experiment(status=ExperimentStatus.RUNNING, message=None, end_time=None, controller_pid=os.getpid(),
                             flow_run_id=flow_run_id, prefect_api=_configured_api())
        logger.info("experiment %s running on %s; trials under %s", experiment_id, ctx.service.platform, exp_dir)
        try:
            status, why = _run(ctx)
        except NoSpaceLeft as exc:  # its trials go on: the record stays RUNNING for resume to take up
            _note_if_space(store, exc)
            raise
        except BaseException as exc:
            ctx.stop.set()  # poll tasks cancel their trials
            stopped = _stopped_by_cancel(exc)
            signum = signal_of(exc)
            why = stop_reason(signum) if signum is not None else "the flow run was cancelled"
            if not stopped:  # in experiment.log, whose handler is gone when Prefect reports the failure
                logger.error("experiment %s ended: %s: %s", experiment_id, type(exc).__name__, exc)
            ended = ExperimentStatus.STOPPED if stopped else ExperimentStatus.ERROR
            message = why if stopped else f"{type(exc).__name__}: {exc}"
            try:
                end_experiment(store, ended, message)
            except Exception as error:
                if no_space(error) is None:
                    raise
                raise NoSpaceLeft.from_error(experiment_id, error, str(exp_dir)) from None
            events.experiment_ended(ended, message)
            raise
        end_experiment(store, status, why)
        trials = store.trials()
        failure = nothing_succeeded(trials, experiment_id) if status == ExperimentStatus.DONE else None
        events.experiment_ended(status, failure or why, trials)
        logger.info("experiment %s %s: %s", experiment_id, status, outcome_line(trials))
        if status == ExperimentStatus.STOPPED:  # stopped before its end: the run says so (Prefect's Cancelled)
            return Cancelled(message=f"experiment {experiment_id} STOPPED: {why}", data=status)
        if failure:
            logger.error("experiment %s: %s", experiment_id, failure)
            return Failed(message=f"experiment {experiment_id} {status}: {failure}", data=status)
    return Completed(message=f"experiment {experiment_id} {status}", data=status)


def run_experiment_flow(config_path: str | None, experiment_id: str | None, root: str | None) -> State:
    """Run :func:`experiment_flow` in this process and return its final state. Without a configured
    PREFECT_API_URL it reports to trialflow's kept local server (:mod:`trialflow.kept_server`), started
    first when needed, or to Prefect's temporary server when that is asked for. Either runs in a session
    of its own: a Ctrl-C in this terminal stops the experiment, never its API. Raises
    :class:`~trialflow.kept_server.ServerError` when the kept server cannot start or a configured API
    does not answer; a stored experiment (``experiment_id``) is then recorded ERROR with that message
    (``trialflow resume`` runs it once the API is back), a new one is not created."""
    with ExitStack() as stack:
        try:
            stack.enter_context(experiment_api())
        except ServerError as exc:
            if experiment_id is not None:
                record_unstarted_run(experiment_id, exc, root)
            raise
        if experiment_id is not None:
            stack.enter_context(tags(*stored_run_tags(experiment_id, root)))
        return experiment_flow(config_path, experiment_id, root, return_state=True)


def record_unstarted_run(experiment_id: str, problem: ServerError, root: str | Path | None = None) -> None:
    """Record a stored experiment (under ``root``, else where it is found) whose run could not begin,
    for want of a Prefect API: ERROR, with the one line that says what to do (what ``create`` prints of
    a background run)."""
    _, store = find_experiment(experiment_id, root)
    try:
        end_experiment(store, ExperimentStatus.ERROR, str(problem))
    finally:
        store.close()


def _note_if_space(store: ExperimentStore, exc: NoSpaceLeft) -> None:
    """Record why the controller stopped, if the store can still be written."""
    try:
        store.set_experiment(message=str(exc), controller_pid=None)
    except Exception as error:  # noqa: BLE001 -- only for want of space: resume finds the controller gone
        if no_space(error) is None:
            raise


def _configured_api() -> str | None:
    """The configured Prefect API this run reports to; None for Prefect's temporary server."""
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value() or None


def final_status(state: State) -> str:
    """The experiment's final status from its run's state (``experiment_flow(..., return_state=True)``),
    also when the run Failed because no trial succeeded (then ``state.is_failed()`` and its message says
    so); raises what ended a run that could not go on. Synchronous also where an event loop runs (a
    notebook's kernel), where Prefect would otherwise hand back an un-awaited coroutine."""
    result = state.result(raise_on_failure=False, _sync=True)  # type: ignore[call-overload]
    if isinstance(result, BaseException):
        raise result
    return str(result)


def _stopped_by_cancel(exc: BaseException) -> bool:
    """A flow-run cancellation from the UI/API (SIGTERM from the worker) or Ctrl-C reaches the flow
    as one of these."""
    return isinstance(exc, KeyboardInterrupt | SystemExit | TerminationSignal | CancelledRun | Abort
                      | asyncio.CancelledError)


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
        future.wrapped_future.add_done_callback(lambda _: self.ctx.slot_freed.set())  # type: ignore[attr-defined]

    def in_flight(self) -> int:
        """Trials holding a slot of the window: started, and their end not yet recorded."""
        return sum(1 for t in self.running if t not in self.ctx.ended)

    def prune(self) -> None:
        """Forget trials whose task run has closed, and what the flow run's context keeps of their task runs."""
        closed = [t for t, f in self.running.items() if f.wrapped_future.done()]  # type: ignore[attr-defined]
        for trial_id in closed:
            del self.running[trial_id]
            self.ctx.ended.discard(trial_id)
        if closed:
            forget_task_runs({run for trial_id in closed for run in self.task_runs.pop(trial_id, ())})

    def close(self) -> None:
        if self.cap is not None:
            self.cap.close()


def _run(ctx: ExperimentContext) -> tuple[str, str | None]:
    """The experiment loop: (DONE, None), or (STOPPED, why) when asked to stop. Raises
    :class:`NoSpaceLeft` when a disk filled up (the trials are left running)."""
    loop = _Loop(ctx)
    watch = StopWatch()
    try:
        upload_code(ctx.experiment_id, str(ctx.service.code_directory()))
        resubmit = _reattach(ctx, loop)
        while True:
            if ctx.halted is None and (full := out_of_space(ctx.experiment_dir)) is not None:
                ctx.halt(full)
            if ctx.halted is not None:
                raise NoSpaceLeft.from_error(ctx.experiment_id, ctx.halted, str(ctx.experiment_dir))
            ctx.slot_freed.clear()  # before looking: a trial ending from here on wakes the wait below
            controls = ctx.store.controls()
            why = "stopped by trialflow stop" if controls.get(Control.STOP) else watch.reason()
            if why:
                return ExperimentStatus.STOPPED, why
            _raise_if_algorithm_failed(ctx)
            _apply_search_space(ctx, controls.get(Control.SEARCH_SPACE))
            for trial_id in controls.get(Control.KILL, []):
                if trial_id in loop.running:
                    ctx.request_cancel(trial_id, TrialStatus.USER_CANCELED)
            concurrency, max_trials, max_duration = loop.limits(controls)
            if loop.capacity is not None:
                concurrency = min(concurrency, loop.capacity)
            budget_over = max_duration is not None and loop.elapsed() >= max_duration
            while loop.in_flight() < concurrency and not budget_over and not loop.exhausted:
                total = ctx.store.count_trials()
                if not resubmit and max_trials is not None and total >= max_trials:
                    break
                if not _start_one(ctx, loop, resubmit):
                    break
            loop.prune()
            loop.reporter.maybe_update()
            total = ctx.store.count_trials()
            no_more = loop.exhausted or budget_over or (max_trials is not None and total >= max_trials)
            if not loop.running and no_more and not resubmit:
                return ExperimentStatus.DONE, None
            ctx.slot_freed.wait(TICK_SECONDS)
    except NoSpaceLeft:
        raise
    except Exception as exc:
        if no_space(exc) is None:
            raise
        ctx.halt(exc)  # before the stop below: the followers leave their trials running
        raise NoSpaceLeft.from_error(ctx.experiment_id, exc, str(ctx.experiment_dir)) from None
    finally:
        ctx.stop.set()
        for future in loop.running.values():
            future.wait()
        loop.close()
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
        ctx.tuner = create_tuner(ctx.config.tuner, space, ctx.config.multi_objective)  # type: ignore[arg-type]
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
