"""Experiment control without a terminal: stop an experiment, kill a trial and update a running
experiment's limits or search space, for the CLI, the Python API and anything else above the flows
(the application layer).

Both work whether or not the experiment's controller runs. With a live controller they ask it
through the store's controls (it cancels its own trials and ends its flow run Cancelled); without
one they record the outcome first, then cancel the trials it left through their training service,
and cancel its Prefect flow run. Warnings (a trial the platform could not stop) are returned, never
printed: the caller decides where they go. The platforms and Prefect are imported only by the calls
that need them, so the CLI's checks of a running controller stay cheap.

Updates are written to the store's controls; a running controller applies them at its next step. A
bad value raises :class:`UpdateError` (a ``UserError``) naming the value and the allowed range.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..foundation.status import EXPERIMENT_LIVE, LIVE, STOPPED_BY_US, ExperimentStatus, TrialStatus
from ..foundation.user_errors import UserError
from ..records.store import Control
from ..trial.procs import pid_alive, process_start_time

if TYPE_CHECKING:
    from ..platforms import TrainingService
    from ..records.store import ExperimentStore


class UpdateError(UserError, ValueError):
    """A value ``update`` refuses; the message names it and what is allowed."""


# what NNI's ``nnictl update`` names -> the control and the allowed integer range
UPDATE_RULES = {"concurrency": (Control.TRIAL_CONCURRENCY, 1, 1000),
                "trialnum": (Control.MAX_TRIAL_NUMBER, 1, 999_999_999)}
UPDATED_VIA = "trialflow update"  # the update history's name for ``update`` (CLI or API)


def update_experiment(store: ExperimentStore, what: str, value: str | int, via: str = UPDATED_VIA) -> int:
    """Set ``concurrency``, ``trialnum`` or ``duration`` (``'30m'``, ``'2h'``, seconds), recorded in the
    update history as made ``via`` that, and return the stored number (seconds for a duration).
    Raises :class:`UpdateError` for a bad value and ``KeyError`` for another ``what``."""
    if what == "duration":
        from ..config import parse_duration

        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            raise UpdateError(f"bad duration value: {exc}") from None
        if not isinstance(seconds, int) or seconds <= 0:
            raise UpdateError(f"bad duration value {value!r}: must be positive, like '30m', '2h' or 3600")
        store.set_control(Control.MAX_EXPERIMENT_DURATION, seconds, via)
        return seconds
    key, low, high = UPDATE_RULES[what]
    try:
        number = int(value)
    except ValueError:
        raise UpdateError(f"bad {what} value {value!r}: must be an integer from {low} to {high}") from None
    if not low <= number <= high:
        raise UpdateError(f"bad {what} value {number}: must be from {low} to {high}")
    store.set_control(key, number, via)
    return number


def clear_run_requests(store: ExperimentStore) -> None:
    """Before a resumed run: forget the stop and the kills asked of the run before."""
    store.set_control(Control.STOP, False)
    store.set_control(Control.KILL, [])


RESUMED_VIA = "trialflow resume"  # the update history's name for resume's --trialnum and --duration


def _spent_seconds(store: ExperimentStore) -> float:
    """The run time the experiment's runs have spent so far (what ``maxExperimentDuration`` counts)."""
    return float(store.controls().get(Control.ELAPSED_SECONDS, 0.0))


def extend_budget(store: ExperimentStore, trialnum: int | None, duration: str | int | None,
                  via: str = RESUMED_VIA) -> list[str]:
    """What ``resume --trialnum/--duration`` sets before the run: a larger ``maxTrialNumber`` (more than
    the trials the experiment has) and a ``maxExperimentDuration`` (more than the run time it spent),
    each recorded in the update history as made ``via``. Returns a line per change saying it. Raises
    :class:`UpdateError` (nothing set) for a budget that would let nothing more run."""
    lines = []
    spent = _spent_seconds(store)
    if trialnum is not None:
        count = store.count_trials()
        if trialnum <= count:
            raise UpdateError(f"--trialnum {trialnum} is not more than the {count} trials experiment "
                              f"{store.experiment_id} has: give a larger number to run more trials")
    if duration is not None:
        from ..config import parse_duration

        try:
            seconds = parse_duration(duration)
        except ValueError as exc:
            raise UpdateError(f"bad --duration value: {exc}") from None
        if not isinstance(seconds, int) or seconds <= spent:
            raise UpdateError(f"--duration {duration} is not more than the {spent:.0f} s experiment "
                              f"{store.experiment_id} has run: give a longer time ('2h', seconds) to run on")
    if trialnum is not None:
        update_experiment(store, "trialnum", trialnum, via)
        lines.append(f"maxTrialNumber of {store.experiment_id} set to {trialnum} ({count} run before)")
    if duration is not None:
        seconds = update_experiment(store, "duration", duration, via)
        lines.append(f"maxExperimentDuration of {store.experiment_id} set to {seconds} s "
                     f"({spent:.0f} s run before)")
    return lines


def update_search_space(store: ExperimentStore, space: Any) -> None:
    """Replace the search space: later trials take their parameters from it (the tuner is rebuilt
    and told the results so far that fit it); running trials keep theirs. A space for a built-in
    tuner is checked first (``SearchSpaceError``); a custom tuner's is its own business."""
    if not store.experiment().config.get("tuner", {}).get("className"):
        from ..records.search_space import parse_search_space

        parse_search_space(space)
    store.set_control(Control.SEARCH_SPACE, space, UPDATED_VIA)


def controller_alive(store: ExperimentStore) -> bool:
    """The experiment's controller runs (and is not this process)."""
    pid = store.experiment().controller_pid
    return bool(pid) and pid != os.getpid() and pid_alive(int(pid))  # type: ignore[arg-type]


class ExperimentRunning(UserError, RuntimeError):
    """The operation needs the experiment's controller to be gone."""


def ensure_not_running(store: ExperimentStore) -> None:
    """Raises :class:`ExperimentRunning` while the experiment's controller runs."""
    if controller_alive(store):
        raise ExperimentRunning(f"experiment {store.experiment_id} is running; stop it first")


def prepare_resume(store: ExperimentStore, trialnum: int | None = None,
                   duration: str | int | None = None, via: str = RESUMED_VIA) -> list[str]:
    """Ready a stored experiment for its next run (``trialflow resume``, the Python API's
    ``resume_experiment``): refused while its controller runs; a larger budget when asked
    (:func:`extend_budget`, whose lines it returns); the stop and kills asked of the run before
    forgotten. Raises :class:`ExperimentRunning` and :class:`UpdateError`, each with nothing changed."""
    if controller_alive(store):
        raise ExperimentRunning(f"experiment {store.experiment_id} is still running (pid "
                                f"{store.experiment().controller_pid})")
    lines = extend_budget(store, trialnum, duration, via)
    clear_run_requests(store)
    return lines


def run_on_budget(store: ExperimentStore, what: str, value: str | int) -> list[str] | None:
    """A larger budget for a DONE experiment, as NNI's manager takes it: ``nnictl update trialnum`` or
    ``duration`` of an experiment that ended DONE and was not stopped sets it RUNNING again when the
    budget lets more run. Readies the experiment's next run with the budget ``what`` (``trialnum`` or
    ``duration``) set to ``value`` (:func:`prepare_resume`; the history names ``update``) and returns
    its lines, for the caller to run it. None, with nothing changed, when the experiment did not end
    DONE, its controller still runs, the value is bad or not larger than what it spent, or the other
    budget is spent: the caller sets the value as for any experiment (and says why a bad one is)."""
    from ..config import parse_duration
    from ..records.store_records import config_in_force

    record = store.experiment()
    if record.status != ExperimentStatus.DONE or what not in ("trialnum", "duration"):
        return None
    in_force, _ = config_in_force(record)
    try:
        if what == "trialnum":
            limit = in_force.get("maxExperimentDuration")
            if limit is None or parse_duration(limit) > _spent_seconds(store):
                return prepare_resume(store, trialnum=int(value), via=UPDATED_VIA)
        else:
            limit = in_force.get("maxTrialNumber")
            if limit is None or store.count_trials() < int(limit):
                return prepare_resume(store, duration=value, via=UPDATED_VIA)
    except (ExperimentRunning, ValueError):  # UpdateError is a ValueError
        pass
    return None


def delete_experiment(store: ExperimentStore, base: Path) -> Path:
    """Delete a finished experiment: its folder (trials, logs, embedded store) and this process's copy
    of its config; returns the folder. ``store`` is closed in every case. Raises
    :class:`ExperimentRunning` while its controller runs (nothing is deleted) and OSError."""
    from ..experiments import delete_experiment_folder

    try:
        ensure_not_running(store)
    finally:
        store.close()
    return delete_experiment_folder(base, store.experiment_id)


def open_service(store: ExperimentStore, base: Path) -> TrainingService:
    """The experiment's training service, for work done without its controller (kill, logs);
    the caller closes it."""
    from ..experiments import load_experiment_config
    from ..platforms import experiment_service

    return experiment_service(load_experiment_config(store, to_run=False), base / store.experiment_id)


def cancel_offline(store: ExperimentStore, base: Path, handles: list[dict[str, Any] | None]) -> list[str]:
    """Stop trials whose controller is gone, through their training service; returns warnings."""
    from ..platforms import PlatformError, TrialHandle

    live = [TrialHandle.from_dict(h) for h in handles if h]
    if not live:
        return []
    warnings = []
    service = open_service(store, base)
    try:
        for handle in live:
            try:
                service.cancel(handle, TrialStatus.USER_CANCELED)
            except PlatformError as exc:
                warnings.append(f"trial {handle.trial_id} may still run: {exc}")
    finally:
        service.close()
    return warnings


def stop_experiment(store: ExperimentStore, base: Path, wait: float = 60.0) -> list[str]:
    """Stop the experiment: ask its controller (SIGTERM after ``wait`` seconds); without one, cancel
    what it left behind (USER_CANCELED) and its flow run. The experiment ends STOPPED unless it had
    already ended DONE or ERROR. Returns warnings."""
    from ..experiments.results import end_experiment
    from ..flows.run_control import end_flow_run  # Prefect's client: only when a run is cancelled here

    store.set_control(Control.STOP, True)
    controller_gone = not controller_alive(store)
    was_running = store.experiment().status in EXPERIMENT_LIVE
    deadline = time.monotonic() + wait
    while controller_alive(store) and time.monotonic() < deadline:
        time.sleep(0.2)
    if controller_alive(store):
        controller_gone = True
        os.kill(int(store.experiment().controller_pid), signal.SIGTERM)  # type: ignore[arg-type]
    # No controller (crashed or never resumed): cancel what it left behind ourselves.
    left = store.trials(list(LIVE))
    for trial in left:
        store.set_status(trial.id, TrialStatus.USER_CANCELED, message="cancelled by trialflow stop")
    # stops a controller recorded and died before finishing: their trials may run on
    unsettled = [t for t in store.trials(list(STOPPED_BY_US)) if t.stopping]
    warnings = cancel_offline(store, base, [t.handle for t in [*left, *unsettled]])
    for trial in unsettled:
        store.settle(trial.id, trial.status, None, trial.message)
    if store.experiment().status not in (ExperimentStatus.DONE, ExperimentStatus.ERROR):
        end_experiment(store, ExperimentStatus.STOPPED)
    record = store.experiment()
    if controller_gone and was_running and record.flow_run_id:
        end_flow_run(record.flow_run_id, record.prefect_api, f"experiment {record.id} stopped by trialflow stop")
    release_web_port(store)
    return warnings


def hold_web_port(store: ExperimentStore, port: int) -> None:
    """``port``, NNI's web UI port, becomes the experiment's address for `trialflow stop --port` and
    ``Experiment.connect(port)``, held by this process: while the experiment runs, and after its end
    until this process stops it or exits. Nothing listens on it."""
    pid = os.getpid()
    store.set_control(Control.WEB_PORT, {"port": port, "pid": pid, "start_time": process_start_time(pid)})


def release_web_port(store: ExperimentStore) -> None:
    """The experiment is on no web UI port any more (NNI's manager frees its port when it stops)."""
    if store.controls().get(Control.WEB_PORT) is not None:
        store.set_control(Control.WEB_PORT, None)


def kill_trial(store: ExperimentStore, base: Path, trial_id: str) -> tuple[str | None, list[str]]:
    """Cancel one trial (USER_CANCELED): through the live controller, or here without one. Returns
    (the status it had already ended with, or None when it was cancelled now; warnings). Raises
    ``KeyError`` for a trial the experiment does not have."""
    trial = store.trial(trial_id)
    if trial.is_terminal:
        return trial.status, []
    if controller_alive(store):
        kills = store.experiment().controls.get(Control.KILL, [])
        store.set_control(Control.KILL, [*kills, trial_id])
        return None, []
    store.set_status(trial_id, TrialStatus.USER_CANCELED, message="cancelled by trialflow trial kill")
    return None, cancel_offline(store, base, [trial.handle])
