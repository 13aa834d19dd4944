"""Shared state of one running experiment, and the in-process registry the Prefect tasks find it in.

Tasks take ids and small values as parameters (never this object, which holds the store, the
service's connections and the tuner): they look the context up by experiment id with
:func:`get_context`. :func:`open_context` builds it (service, tuner, assessor), registers it and,
on exit, unregisters it and closes the service; the experiment flow and a user's own flow
(``trialflow.app.api.experiment_session``) both use it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..assessors import ASSESSORS, Assessor, create_assessor
from ..config import ExperimentConfig
from ..foundation.readable import Wakeup
from ..platforms import CodeRef, RetryPolicy, TrainingService, TrialStatus, experiment_service, platform
from ..platforms.hybrid import HybridService
from ..platforms.report_desk import ReportDesk
from ..platforms.trial_output import OutputBudget
from ..records.store import ExperimentStore
from ..tuners import TUNERS, Tuner, create_tuner
from ..tuners.custom import Checkpoint, dispatcher_environment, is_custom


class FollowingHalted(Exception):
    """The experiment was halted (:meth:`ExperimentContext.halt`): a trial's follower leaves it as it is."""


@dataclass
class ExperimentContext:
    experiment_id: str
    experiment_dir: Path
    config: ExperimentConfig
    store: ExperimentStore
    service: TrainingService
    tuner: Tuner
    assessor: Assessor | None = None
    poll_interval: float = 0.2
    max_trial_duration: float | None = None
    code: CodeRef | None = None  # set by the upload_code task
    checkpoint: Checkpoint | None = None  # a customized algorithm's (NNI's dispatcher checkpoint folder)
    stop: threading.Event = field(default_factory=threading.Event)
    tuner_lock: threading.Lock = field(default_factory=threading.Lock)
    cancel_requests: dict[str, TrialStatus] = field(default_factory=dict)
    # why a trial's last submission attempt failed (read by its poll task when no handle was stored)
    submit_errors: dict[str, str] = field(default_factory=dict)
    # parameter id -> raw values of trials taken over from an earlier run (resume)
    adopted: dict[int, dict[str, Any]] = field(default_factory=dict)
    # trials whose end is recorded (and told to the tuner): their slot in the window is free even
    # while their task run is still closing; ``slot_freed`` wakes the experiment loop (set through
    # :meth:`free_slot`, under ``_wakeups_lock``: none is written once it is closed)
    ended: set[str] = field(default_factory=set)
    slot_freed: Wakeup = field(default_factory=Wakeup)
    on_trial_end: list[Any] = field(default_factory=list)  # callbacks(trial_id), e.g. a platform cap's release
    output_budget: OutputBudget = field(default_factory=OutputBudget)  # its trials' output sent to Prefect
    # set when the controller cannot go on but its trials can (a full disk): followers leave their
    # trials running and return, the loop ends with this error
    halted: BaseException | None = None
    # where trials ask the assessor at report time (an assessor and a platform whose trials reach it)
    desk: ReportDesk | None = None
    # each follower's wake-up, for a platform whose waits watch one (``quiet_poll_seconds``): set by a
    # cancel of its trial, the experiment's stop and a halt; under ``_wakeups_lock`` (no write to a closed one)
    wakeups: dict[str, Wakeup] = field(default_factory=dict)
    _wakeups_lock: threading.Lock = field(default_factory=threading.Lock)
    _closed: bool = False

    def follower_wakeup(self, trial_id: str) -> Wakeup:
        """The wake-up of trial ``trial_id``'s follower (made at its first call; closed by :meth:`trial_ended`)."""
        with self._wakeups_lock:
            wakeup = self.wakeups.get(trial_id)
            if wakeup is None:
                wakeup = self.wakeups[trial_id] = Wakeup()
                if trial_id in self.cancel_requests or self.stop.is_set() or self.halted is not None:
                    wakeup.set()
            return wakeup

    def free_slot(self) -> None:
        """Wake the experiment loop: a trial ended, its task run closed, or the experiment halted."""
        with self._wakeups_lock:
            if not self._closed:
                self.slot_freed.set()

    def close(self) -> None:
        """Close the loop's and the followers' wake-ups (the experiment's run is over)."""
        with self._wakeups_lock:
            self._closed = True
            self.slot_freed.close()
            for wakeup in self.wakeups.values():
                wakeup.close()
            self.wakeups.clear()

    def _wake(self, trial_id: str | None = None) -> None:
        """Set the wake-up of ``trial_id``'s follower, or of every follower."""
        with self._wakeups_lock:
            for key, wakeup in self.wakeups.items():
                if trial_id is None or key == trial_id:
                    wakeup.set()

    def request_stop(self) -> None:
        """Stop the experiment: every follower cancels its trial (USER_CANCELED) now."""
        self.stop.set()
        self._wake()

    def trial_ended(self, trial_id: str) -> None:
        with self._wakeups_lock:
            wakeup = self.wakeups.pop(trial_id, None)
        if wakeup is not None:
            wakeup.close()
        self.ended.add(trial_id)
        if self.desk is not None:
            self.desk.forget(trial_id)
        for callback in self.on_trial_end:
            callback(trial_id)
        self.free_slot()

    def request_cancel(self, trial_id: str, reason: TrialStatus) -> None:
        self.cancel_requests.setdefault(trial_id, reason)
        self._wake(trial_id)

    def halt(self, error: BaseException) -> None:
        """Stop following trials without stopping them (the first error is kept); wakes the loop."""
        if self.halted is None:
            self.halted = error
        self.free_slot()
        self._wake()


log = logging.getLogger("trialflow.experiment")
# NNI's logLevel names -> the level of trialflow's loggers in the controller
LOG_LEVELS = {"fatal": logging.CRITICAL, "error": logging.ERROR, "warning": logging.WARNING, "info": logging.INFO,
              "debug": logging.DEBUG, "trace": logging.DEBUG}
_CONTEXTS: dict[str, ExperimentContext] = {}
_LOCK = threading.Lock()


class ContextNotFound(LookupError):
    """No running experiment with that id in this process."""


def get_context(experiment_id: str) -> ExperimentContext:
    """The running experiment ``experiment_id`` of this process (for the Prefect tasks)."""
    try:
        return _CONTEXTS[experiment_id]
    except KeyError:
        raise ContextNotFound(f"experiment {experiment_id} is not open in this process: run the tasks inside "
                              "experiment_flow or trialflow.app.api.experiment_session()") from None


@contextmanager
def open_context(experiment_id: str, experiment_dir: Path, config: ExperimentConfig,
                 store: ExperimentStore) -> Iterator[ExperimentContext]:
    """Build the experiment's service, tuner and assessor, register the context for the tasks and
    prepare the service (transient platform errors retried with its platform's policy); on exit stop
    its trials' followers, unregister it and close the service (trials keep running). A customized
    tuner or assessor has NNI's dispatcher environment for the block (:func:`_customized_checkpoint`)."""
    logging.getLogger("trialflow").setLevel(LOG_LEVELS[config.log_level or "info"])
    with ExitStack() as dispatcher:
        checkpoint = _customized_checkpoint(config, experiment_dir, dispatcher)
        tuner = create_tuner(config.tuner, config.search_space, config.multi_objective,  # type: ignore[arg-type]
                             checkpoint)
        assessor = create_assessor(config.assessor, config.multi_objective, checkpoint) if config.assessor else None
        service = experiment_service(config, experiment_dir)
        ctx = ExperimentContext(experiment_id, experiment_dir, config, store, service, tuner, assessor,
                                max_trial_duration=config.max_trial_duration, checkpoint=checkpoint)
        with _LOCK:
            if experiment_id in _CONTEXTS:
                service.close()
                raise RuntimeError(f"experiment {experiment_id} is already running in this process")
            _CONTEXTS[experiment_id] = ctx
        try:
            # a hybrid service retries each member with its own platform's policy
            hybrid = isinstance(service, HybridService)
            retry = RetryPolicy(retries=0) if hybrid else platform(service.config.platform).retry
            retry.call(ctx.service.prepare, lambda exc, delay: log.warning(
                "preparing %s failed (%s); retrying in %.0f s", service.platform, exc, delay))
            if assessor is not None:
                ctx.desk = _open_desk(service)
            yield ctx
        finally:
            ctx.request_stop()
            with _LOCK:
                _CONTEXTS.pop(experiment_id, None)
            if ctx.desk is not None:
                ctx.desk.close()
            service.close()
            ctx.close()


def _customized_checkpoint(config: ExperimentConfig, experiment_dir: Path, stack: ExitStack) -> Checkpoint | None:
    """With a customized tuner or assessor: its checkpoint, NNI's dispatcher variables set until
    ``stack`` closes (:func:`~trialflow.tuners.custom.dispatcher_environment`); else None."""
    if not (is_custom(config.tuner, TUNERS) or (config.assessor and is_custom(config.assessor, ASSESSORS))):
        return None
    return stack.enter_context(dispatcher_environment(experiment_dir))


def _open_desk(service: TrainingService) -> ReportDesk | None:
    """The report desk, when the platform's trials can reach it (it opens what they need); None
    otherwise (the assessor then judges at each poll)."""
    desk = ReportDesk()
    if not service.use_report_desk(desk):
        desk.close()
        return None
    return desk
