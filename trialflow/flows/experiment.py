"""The experiment flow: one Prefect flow run per experiment (run name = experiment id), built only
from the task library (``trialflow.tasks``); its trials run in :mod:`trialflow.flows.trial_loop`.

``upload_code`` runs once. The run ends DONE when the budget (``maxTrialNumber``,
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
import os
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, tags
from prefect.context import FlowRunContext, TagsContext
from prefect.exceptions import Abort, CancelledRun, TerminationSignal
from prefect.states import Cancelled, Completed, Failed, State
from prefect.task_runners import ThreadPoolTaskRunner

from ..config import load_config
from ..experiments import (
    default_root,
    find_experiment,
    load_experiment_config,
    open_store,
)
from ..experiments.context import open_context
from ..experiments.results import end_experiment, nothing_succeeded, outcome_line
from ..experiments.warm_start import create_warm_started
from ..foundation.ids import new_experiment_id
from ..foundation.status import ExperimentStatus
from ..foundation.withheld import withhold, withhold_folders
from ..records.disk_space import NoSpaceLeft, no_space
from ..records.store import ExperimentStore
from ..server.kept_server import ServerError
from ..tracking import tracking
from .api_outage import rest_of_run_tries_once_if_api_gone, settings_scope
from .events import ExperimentEvents
from .run_api import experiment_api
from .run_control import (
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
from .trial_loop import run_trials

MAX_THREADS = 1024  # the window, not the pool, bounds concurrency (it may grow at run time)


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
    try:
        return _run_experiment(config_path, experiment_id, working_directory, overrides)
    finally:
        rest_of_run_tries_once_if_api_gone()  # for the final state, which the engine sets after this


def _run_experiment(config_path: str | None, experiment_id: str | None, working_directory: str | None,
                    overrides: dict[str, Any] | None) -> State:
    """The body of :func:`experiment_flow` (which see), inside its flow run."""
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
        # trialflow's own (the experiments home holds the kept server's auth string): a code directory
        # holding them uploads neither
        withhold_folders(root, default_root())
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
            status, why = run_trials(ctx)
        except NoSpaceLeft as exc:  # its trials go on: the record stays RUNNING for resume to take up
            _note_if_space(store, exc)
            raise
        except BaseException as exc:
            ctx.request_stop()  # poll tasks cancel their trials
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
    PREFECT_API_URL it reports to trialflow's kept local server (:mod:`trialflow.server.kept_server`), started
    first when needed, or to Prefect's temporary server when that is asked for. Either runs in a session
    of its own: a Ctrl-C in this terminal stops the experiment, never its API. Raises
    :class:`~trialflow.server.kept_server.ServerError` when the kept server cannot start or a configured API
    does not answer; a stored experiment (``experiment_id``) is then recorded ERROR with that message
    (``trialflow resume`` runs it once the API is back), a new one is not created."""
    with ExitStack() as stack:
        stack.enter_context(settings_scope())  # what the run's end sets (rest_of_run_tries_once_if_api_gone)
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


def final_status(state: State, experiment_id: str, root: str | Path) -> str:
    """The experiment's final status from its run's state (``experiment_flow(..., return_state=True)``),
    also when the run Failed because no trial succeeded (then ``state.is_failed()`` and its message says
    so); raises what ended a run that could not go on. Synchronous also where an event loop runs (a
    notebook's kernel), where Prefect would otherwise hand back an un-awaited coroutine.

    A state without data is the API's copy, which Prefect's engine hands back when the run's final
    state was refused as set already (its first answer lost to an API that stalled past the client's
    timeout, then sent again); the experiment's record (``experiment_id`` under ``root``) says then."""
    if state.data is None:
        store = open_store(Path(root), experiment_id)
        try:
            return str(store.experiment().status)
        finally:
            store.close()
    result = state.result(raise_on_failure=False, _sync=True)  # type: ignore[call-overload]
    if isinstance(result, BaseException):
        raise result
    return str(result)


def _stopped_by_cancel(exc: BaseException) -> bool:
    """A flow-run cancellation from the UI/API (SIGTERM from the worker) or Ctrl-C reaches the flow
    as one of these."""
    return isinstance(exc, KeyboardInterrupt | SystemExit | TerminationSignal | CancelledRun | Abort
                      | asyncio.CancelledError)
