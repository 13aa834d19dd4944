"""Experiment control without a terminal: stop an experiment and kill a trial, for the CLI, the
Python API and anything else above the flows (the application layer).

Both work whether or not the experiment's controller runs. With a live controller they ask it
through the store's controls (it cancels its own trials and ends its flow run Cancelled); without
one they record the outcome first, then cancel the trials it left through their training service,
and cancel its Prefect flow run. Warnings (a trial the platform could not stop) are returned, never
printed: the caller decides where they go. The platforms and Prefect are imported only by the calls
that need them, so the CLI's checks of a running controller stay cheap.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .status import EXPERIMENT_LIVE, LIVE, ExperimentStatus, TrialStatus
from .trial.procs import pid_alive

if TYPE_CHECKING:
    from .platforms import TrainingService
    from .store import ExperimentStore


def controller_alive(store: ExperimentStore) -> bool:
    """The experiment's controller runs (and is not this process)."""
    pid = store.experiment().controller_pid
    return bool(pid) and pid != os.getpid() and pid_alive(int(pid))  # type: ignore[arg-type]


def open_service(store: ExperimentStore, base: Path) -> TrainingService:
    """The experiment's training service, for work done without its controller (kill, logs);
    the caller closes it."""
    from .experiments import load_experiment_config
    from .platforms import experiment_service

    return experiment_service(load_experiment_config(store), base / store.experiment_id)


def cancel_offline(store: ExperimentStore, base: Path, handles: list[dict[str, Any] | None]) -> list[str]:
    """Stop trials whose controller is gone, through their training service; returns warnings."""
    from .platforms import PlatformError, TrialHandle

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
    from .flows.run_control import cancel_flow_run  # Prefect's client: only when a run is cancelled here
    from .results import end_experiment

    store.set_control("stop", True)
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
    warnings = cancel_offline(store, base, [t.handle for t in left])
    if store.experiment().status not in (ExperimentStatus.DONE, ExperimentStatus.ERROR):
        end_experiment(store, ExperimentStatus.STOPPED)
    record = store.experiment()
    if controller_gone and was_running and record.flow_run_id:
        cancel_flow_run(record.flow_run_id, record.prefect_api, f"experiment {record.id} stopped by trialflow stop")
    return warnings


def kill_trial(store: ExperimentStore, base: Path, trial_id: str) -> tuple[str | None, list[str]]:
    """Cancel one trial (USER_CANCELED): through the live controller, or here without one. Returns
    (the status it had already ended with, or None when it was cancelled now; warnings). Raises
    ``KeyError`` for a trial the experiment does not have."""
    trial = store.trial(trial_id)
    if trial.is_terminal:
        return trial.status, []
    if controller_alive(store):
        kills = store.experiment().controls.get("kill", [])
        store.set_control("kill", [*kills, trial_id])
        return None, []
    store.set_status(trial_id, TrialStatus.USER_CANCELED, message="cancelled by trialflow trial kill")
    return None, cancel_offline(store, base, [trial.handle])
