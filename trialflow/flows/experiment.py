"""The experiment flow: one Prefect flow run per experiment (run name = experiment id).

The loop keeps at most ``trialConcurrency`` trials in flight (a bounded window, re-read every tick so
``trialflow update`` applies at run time), asks the tuner while budget remains, and runs each trial
-- submission and following -- in its own ``trial`` task run (one trial, one task run). It ends
DONE when the budget (``maxTrialNumber``, ``maxExperimentDuration``, or a finished grid) is spent
and every trial has ended, STOPPED on ``trialflow stop`` (running trials are cancelled as
USER_CANCELED), ERROR when the service or tuner cannot go on.

Resume (the same flow on an existing experiment id): finished trials are replayed to the tuner,
running trials are re-attached through their stored handles, trials that were never submitted are
submitted again with their original parameters; ``maxTrialNumber`` keeps counting every trial.
Parameters of the flow are ids and paths only: secrets never become flow parameters.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.futures import PrefectFuture
from prefect.task_runners import ThreadPoolTaskRunner

from ..assessors import create_assessor
from ..config import load_config
from ..context import ExperimentContext
from ..experiments import create_experiment, find_experiment, load_experiment_config, open_store
from ..ids import new_trial_id
from ..platforms import (
    CodeRef,
    TrialHandle,
    TrialSpec,
    TrialStatus,
    create_service,
)
from ..tasks.code import upload_code
from ..tasks.trials import run_trial
from ..tasks.tuner import suggest
from ..tuners import create_tuner, scalar_or_none
from ..ui import ArtifactReporter

TICK_SECONDS = 0.25
RESUBMITTED = "resubmitted after a restart: it was never submitted"
MAX_THREADS = 1024  # the window, not the pool, bounds concurrency (it may grow at run time)


def _run_name() -> str:
    from prefect.runtime import flow_run

    params = flow_run.parameters
    if params.get("experiment_id"):
        return str(params["experiment_id"])
    return f"new-{Path(str(params.get('config_path') or 'experiment')).parent.name or 'experiment'}"


@flow(name="experiment", flow_run_name=_run_name, task_runner=ThreadPoolTaskRunner(max_workers=MAX_THREADS),  # type: ignore[arg-type]
      validate_parameters=False)
def experiment_flow(config_path: str | None = None, experiment_id: str | None = None,
                    working_directory: str | None = None) -> str:
    """Run a new experiment from ``config_path``, or run/resume the stored ``experiment_id``
    (found under ``working_directory`` or the known roots). Returns the final status."""
    logger = get_run_logger()
    if experiment_id is None:
        if not config_path:
            raise ValueError("give config_path (new experiment) or experiment_id (existing one)")
        config_path = os.path.abspath(config_path)
        experiment_id, exp_dir = create_experiment(load_config(config_path), config_path)
        root = exp_dir.parent
    else:
        root = Path(working_directory) if working_directory else find_experiment(experiment_id)[0]
    store = open_store(root, experiment_id)
    exp_dir = root / experiment_id
    try:
        config = load_experiment_config(store, config_path)
        service = create_service(config.services[0], exp_dir)
        tuner = create_tuner(config.tuner, config.space)  # type: ignore[arg-type]
        assessor = create_assessor(config.assessor) if config.assessor else None
        service.prepare()
    except Exception as exc:
        store.set_experiment(status="ERROR", message=str(exc), end_time=time.time())
        raise
    ctx = ExperimentContext(experiment_id, exp_dir, config, store, service, tuner, assessor,
                            max_trial_duration=config.max_trial_duration)
    store.set_experiment(status="RUNNING", message=None, end_time=None, controller_pid=os.getpid())
    logger.info("experiment %s running on %s; trials under %s", experiment_id, service.platform, exp_dir)
    try:
        status = _run(ctx)
    except BaseException as exc:
        ctx.stop.set()  # poll tasks cancel their trials
        store.set_experiment(status="ERROR", message=f"{type(exc).__name__}: {exc}", end_time=time.time())
        raise
    finally:
        ctx.stop.set()
        service.close()
    store.set_experiment(status=status, end_time=time.time(), controller_pid=None)
    logger.info("experiment %s %s", experiment_id, status)
    return status


class _Loop:
    """State of one run of the experiment loop."""

    def __init__(self, ctx: ExperimentContext) -> None:
        self.ctx = ctx
        self.running: dict[str, PrefectFuture[Any]] = {}
        self.exhausted = False
        controls = ctx.store.controls()
        self.elapsed_before = float(controls.get("elapsed_seconds", 0.0))
        self.started = time.monotonic()
        self.reporter = ArtifactReporter(ctx)

    def elapsed(self) -> float:
        return self.elapsed_before + time.monotonic() - self.started

    def limits(self, controls: dict[str, Any]) -> tuple[int, int | None, float | None]:
        cfg = self.ctx.config
        return (int(controls.get("trial_concurrency", cfg.trial_concurrency)),
                controls.get("max_trial_number", cfg.max_trial_number),
                controls.get("max_experiment_duration", cfg.max_experiment_duration))

    def start(self, trial_id: str, sequence: int, spec: TrialSpec | None, handle: TrialHandle | None,
              code: CodeRef) -> None:
        future = run_trial.submit(self.ctx, trial_id, sequence, spec, handle, code)
        self.running[trial_id] = future
        # The wrapped concurrent future answers locally; PrefectFuture.state asks the API every time.
        future.wrapped_future.add_done_callback(lambda _: self.ctx.slot_freed.set())  # type: ignore[attr-defined]

    def in_flight(self) -> int:
        """Trials holding a slot of the window: started, and their end not yet recorded."""
        return sum(1 for t in self.running if t not in self.ctx.ended)

    def prune(self) -> None:
        """Forget trials whose task run has closed."""
        for trial_id in [t for t, f in self.running.items() if f.wrapped_future.done()]:  # type: ignore[attr-defined]
            del self.running[trial_id]
            self.ctx.ended.discard(trial_id)


def _run(ctx: ExperimentContext) -> str:
    loop = _Loop(ctx)
    code = upload_code(ctx, ctx.config.services[0].trial_code_directory)
    resubmit = _reattach(ctx, loop, code)
    try:
        while True:
            ctx.slot_freed.clear()  # before looking: a trial ending from here on wakes the wait below
            controls = ctx.store.controls()
            if controls.get("stop"):
                return "STOPPED"
            for trial_id in controls.get("kill", []):
                if trial_id in loop.running:
                    ctx.request_cancel(trial_id, TrialStatus.USER_CANCELED)
            concurrency, max_trials, max_duration = loop.limits(controls)
            budget_over = max_duration is not None and loop.elapsed() >= max_duration
            while loop.in_flight() < concurrency and not budget_over and not loop.exhausted:
                total = ctx.store.count_trials()
                if not resubmit and max_trials is not None and total >= max_trials:
                    break
                if not _start_one(ctx, loop, code, resubmit):
                    break
            loop.prune()
            loop.reporter.maybe_update()
            total = ctx.store.count_trials()
            no_more = loop.exhausted or budget_over or (max_trials is not None and total >= max_trials)
            if not loop.running and no_more and not resubmit:
                return "DONE"
            ctx.slot_freed.wait(TICK_SECONDS)
    finally:
        ctx.stop.set()
        for future in loop.running.values():
            future.wait()
        ctx.store.set_control("elapsed_seconds", loop.elapsed())
        loop.reporter.update()


def _start_one(ctx: ExperimentContext, loop: _Loop, code: CodeRef, resubmit: list[Any]) -> bool:
    """Submit one trial (a never-submitted one from before a resume first); False when none is left."""
    if resubmit:
        trial = resubmit.pop(0)
        trial_id, sequence, parameter_id, parameters = trial.id, trial.sequence, trial.parameter_id, trial.parameters
        ctx.store.note(trial_id, RESUBMITTED)
    else:
        suggestion = suggest(ctx)
        if suggestion is None:
            loop.exhausted = True
            return False
        trial_id = new_trial_id()
        parameter_id, parameters = suggestion.parameter_id, suggestion.parameters
        sequence = ctx.store.add_trial(trial_id, None, parameter_id, parameters, suggestion.raw,
                                       str(ctx.experiment_dir / "trials" / trial_id)).sequence
    service_cfg = ctx.config.services[0]
    spec = TrialSpec(ctx.experiment_id, trial_id, sequence, parameter_id, parameters, service_cfg.trial_command,
                     Path(code.location), service_cfg.trial_gpu_number)
    loop.start(trial_id, sequence, spec, None, code)
    return True


def _reattach(ctx: ExperimentContext, loop: _Loop, code: CodeRef) -> list[Any]:
    """Replay finished trials to the tuner and follow live ones; returns trials to submit again."""
    resubmit = []
    for trial in ctx.store.trials():
        if trial.is_terminal:
            value = scalar_or_none(trial.final) if trial.status == "SUCCEEDED" else None
            ctx.tuner.replay(trial.parameter_id, trial.raw, value)
            continue
        ctx.tuner.reserve(trial.parameter_id)
        ctx.adopted[trial.parameter_id] = trial.raw
        if trial.handle is None:
            resubmit.append(trial)
        else:
            handle = TrialHandle.from_dict(trial.handle)
            ctx.service.adopt(handle)
            loop.start(trial.id, trial.sequence, None, handle, code)
    return resubmit
