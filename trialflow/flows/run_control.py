"""How an experiment's flow run talks to Prefect about itself: its name and tags, a retry of it, a
cancel of it, and a Ctrl-C in the terminal that runs it.

Lifecycle: a run of a stored experiment is created with its tags (:func:`stored_run_tags`); inside the
experiment flow, :func:`label_run` names the run by its experiment id and tags it once the id is known
(a deployment's run of a new experiment learns it there); :func:`retried_experiment` tells a retried run
(the UI's Retry) which experiment it created, so it resumes that one; a :class:`StopWatch` is asked
every loop tick whether the run must stop (a Ctrl-C noted by :func:`interrupt`, or the run Cancelling in
Prefect: there is no worker to kill a run started from the CLI or a notebook). Outside the flow,
:func:`end_flow_run` gives a run whose controller is gone a final state. Every Prefect call here is best
effort: an unreachable API never stops the experiment, it is logged.
"""

from __future__ import annotations

import logging
import signal
import time
from typing import Any
from uuid import UUID

from ..config import ExperimentConfig
from ..experiments import ExperimentNotFound, find_experiment, stored_config
from ..foundation.ids import looks_like_experiment_id
from ..foundation.readable import Wakeup
from .api_outage import OptionalCalls, next_try_after

log = logging.getLogger("trialflow.experiment")

# how often a running experiment asks Prefect whether its run is being cancelled: each ask costs the server
# ~10 ms of CPU and the controller ~2 ms (benchmarks/README.md), paid for as long as the experiment runs; a
# cancel from Prefect's UI or API lands within this (a worker's runs are also stopped by their worker)
CANCEL_CHECK_SECONDS = 5.0
TAG = "trialflow"
_signal: list[int] = []  # the signal that asked this process's experiment to stop (SIGINT: Ctrl-C)
_interrupted_wakeup: list[Wakeup] = []  # made once, at the first interrupt_fd(), and kept open


def interrupt(signum: int = signal.SIGINT) -> None:
    """Ask the experiment running in this process to stop (safe in a signal handler: no lock is taken),
    waking its loop (:func:`interrupt_fd`)."""
    _signal[:] = [signum]
    for wakeup in _interrupted_wakeup:
        wakeup.set()


def clear_interrupt() -> None:
    _signal.clear()
    for wakeup in _interrupted_wakeup:
        wakeup.clear()


def interrupt_fd() -> int:
    """A descriptor readable once :func:`interrupt` was called since :func:`clear_interrupt`: the experiment
    loop waits on it. One per process, open for the rest of it."""
    if not _interrupted_wakeup:
        _interrupted_wakeup.append(Wakeup())
        if _signal:
            _interrupted_wakeup[0].set()
    return _interrupted_wakeup[0].fd


def interrupted() -> int | None:
    """The signal that called :func:`interrupt` since :func:`clear_interrupt` (None: none did)."""
    return _signal[0] if _signal else None


def signal_of(exc: BaseException) -> int | None:
    """The signal behind an exception that ended a run: Ctrl-C's KeyboardInterrupt, Prefect's
    TerminationSignal (a SIGTERM during the run); None for anything else."""
    if isinstance(exc, KeyboardInterrupt):
        return signal.SIGINT
    from prefect.exceptions import TerminationSignal

    return exc.signal if isinstance(exc, TerminationSignal) else None


def stop_reason(signum: int) -> str:
    return "stopped by Ctrl-C" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"


def _this_run() -> Any:
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    return ctx.flow_run if ctx is not None else None


def run_tags(experiment_id: str, config: ExperimentConfig) -> list[str]:
    """The tags of an experiment's run: ``trialflow``, its id, its platforms, its tuner and, when it has
    one, its ``experimentName`` (as ``name:<name>``: the UI's run list shows tags beside the id)."""
    tuner = config.tuner.label if config.tuner else None
    platforms = [s.platform for s in config.services]
    named = [f"name:{config.experiment_name}"] if config.experiment_name else []
    return list(dict.fromkeys([TAG, experiment_id, *platforms, *([tuner] if tuner else []), *named]))


def stored_run_tags(experiment_id: str, root: str | None) -> list[str]:
    """:func:`run_tags` of a stored experiment, for a run created with them (so its first state
    events carry them: Prefect takes a run's tags for its events when it is created, and an
    automation on ``prefect.tag.trialflow`` matches those); ``trialflow`` and the id when its store
    cannot be read here (the run then labels itself once it has opened it)."""
    try:
        _, store = find_experiment(experiment_id, root)
        try:
            return run_tags(experiment_id, stored_config(store))
        finally:
            store.close()
    except Exception as exc:  # noqa: BLE001 -- the tags are best effort: the run opens the store itself
        log.debug("tags of experiment %s not read before its run: %s", experiment_id, exc)
        return [TAG, experiment_id]


def label_run(experiment_id: str, tags: list[str]) -> str | None:
    """Name this flow run by ``experiment_id`` and add ``tags``; returns the run's id (None outside a
    flow run)."""
    from prefect import get_client

    run = _this_run()
    if run is None:
        return None
    try:
        with get_client(sync_client=True) as client:
            client.update_flow_run(run.id, name=experiment_id, tags=list(dict.fromkeys([*run.tags, *tags])))
    except Exception as exc:  # noqa: BLE001 -- a label is not worth stopping an experiment for
        log.warning("could not name the flow run %s after experiment %s: %s", run.id, experiment_id, exc)
    return str(run.id)


def retried_experiment() -> str | None:
    """The experiment this flow run created on an earlier attempt, when it is being retried (Prefect's
    Retry: the same run, run again with the same parameters, renamed from them); else None. Found by
    its tags and confirmed by the experiment's own record of its flow run."""
    run = _this_run()
    if run is None or run.run_count <= 1 or TAG not in run.tags:
        return None
    for tag in filter(looks_like_experiment_id, run.tags):
        try:
            _, store = find_experiment(tag)
        except ExperimentNotFound:
            continue
        try:
            if store.experiment().flow_run_id == str(run.id):
                return str(tag)
        finally:
            store.close()
    return None


def _state_type(client: Any, flow_run_id: str) -> str | None:
    state = client.read_flow_run(flow_run_id).state
    return state.type.value if state is not None else None


def _cancelled_filter(flow_run_id: UUID) -> Any:
    """Prefect's filter for the flow run ``flow_run_id`` in state Cancelling or Cancelled."""
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterId,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    return FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]), state=FlowRunFilterState(
        type=FlowRunFilterStateType(any_=[StateType.CANCELLING, StateType.CANCELLED])))


class StopWatch:
    """Answers "must the experiment stop, and why" from what is not in the store: Ctrl-C in this
    process, and this flow run Cancelling (asked of Prefect at most every ``CANCEL_CHECK_SECONDS``).

    Lifecycle: made by the experiment loop inside the flow run, asked at its looks, closed at its end. It
    keeps one Prefect client for its checks, made at the first and made again after a call that failed
    (a client costs more to make than a call), and asks for a count of its run in a cancelled state (the
    server sends one number, not the whole run)."""

    def __init__(self) -> None:
        run = _this_run()
        self.next_check = time.monotonic() + CANCEL_CHECK_SECONDS
        self.calls = OptionalCalls("the cancel check", log)
        self._client: Any = None
        self._cancelled = _cancelled_filter(run.id) if run is not None else None  # None: no run to ask about

    def reason(self) -> str | None:
        if (signum := interrupted()) is not None:
            return stop_reason(signum)
        if self._cancelled is None or time.monotonic() < self.next_check:
            return None
        started = time.monotonic()
        try:
            with self.calls.once():
                if self._client is None:
                    from prefect import get_client

                    self._client = get_client(sync_client=True).__enter__()
                cancelled = self._client.count_flow_runs(flow_run_filter=self._cancelled) > 0
        except Exception as exc:  # noqa: BLE001 -- asked again next time
            self.calls.failed(exc)
            self.close()
            return None
        else:
            self.calls.answered()
        finally:
            self.next_check = next_try_after(CANCEL_CHECK_SECONDS, started)
        return "the flow run was cancelled" if cancelled else None

    def close(self) -> None:
        """Close its client (a later check makes another). Raises nothing."""
        client, self._client = self._client, None
        if client is not None:
            try:
                client.__exit__(None, None, None)
            except Exception as exc:  # noqa: BLE001 -- closing a connection to an API that went away
                log.debug("closing the cancel check's client: %s", exc)


def end_flow_run(flow_run_id: str, api: str | None, message: str, crashed: bool = False) -> bool:
    """Put a flow run left Running or Cancelling by a controller that is gone into Cancelled (a stop), or
    Crashed (``crashed``: the run was given up, as when the experiment is resumed by a new run), on the
    API ``api`` it ran against (None: Prefect's temporary server, whose database is this Prefect home's;
    the kept server is started again when it was stopped); True when it was changed. Raises nothing: an
    unreachable API is logged."""
    from prefect import get_client
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings
    from prefect.states import Cancelled, Crashed

    from ..server.kept_server import auth_for, revive
    from .temporary_server import start_temporary_server

    auth = auth_for(api)  # the kept server's, when ``api`` is its address
    settings = (temporary_settings(updates={PREFECT_API_URL: api, **({PREFECT_API_AUTH_STRING: auth} if auth else {})})
                if api else temporary_settings(restore_defaults={PREFECT_API_URL}))
    try:
        with settings:
            if api:
                revive(api)
            else:
                start_temporary_server()
            with get_client(sync_client=True) as client:
                if _state_type(client, flow_run_id) not in ("RUNNING", "CANCELLING", "PENDING", "SCHEDULED"):
                    return False
                client.set_flow_run_state(flow_run_id, (Crashed if crashed else Cancelled)(message=message),
                                          force=True)
    except Exception as exc:  # noqa: BLE001 -- the experiment is stopped or resumed either way
        log.warning("could not mark flow run %s %s: %s", flow_run_id, "crashed" if crashed else "cancelled", exc)
        return False
    return True
