"""Python API for notebooks and scripts: ``trialflow.run_experiment(config)`` runs a whole experiment;
``trialflow.experiment_session(config)`` opens one for a flow of your own built from the task library
(``trialflow.tasks``); ``stop_experiment`` and ``kill_trial`` do what ``trialflow stop`` and
``trialflow trial kill`` do, with or without the experiment's controller running."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import ExperimentConfig, load_config, parse_config
from ..experiments import find_experiment, open_store
from ..experiments.context import ExperimentContext, open_context
from ..experiments.results import best_trial, end_experiment, maximizes, multi_objective, pareto_set, trial_value
from ..experiments.warm_start import create_warm_started
from ..foundation.ids import new_trial_id
from ..foundation.status import EXPERIMENT_ENDED, ExperimentStatus
from ..records.store import TrialRecord

log = logging.getLogger("trialflow")


@dataclass
class ExperimentResult:
    """The outcome of an experiment: status, best trial and every trial record. A multi-objective
    experiment has no ``best``; ``pareto`` is its Pareto set (empty for a single-objective one)."""

    experiment_id: str
    status: str
    directory: Path
    trials: list[TrialRecord]
    best: TrialRecord | None
    pareto: list[TrialRecord] = field(default_factory=list)

    @property
    def best_value(self) -> float | None:
        return trial_value(self.best) if self.best else None

    def records(self) -> list[dict[str, Any]]:
        return [{"trial_id": t.id, "sequence": t.sequence, "status": t.status, "value": trial_value(t),
                 "final": t.final, **{f"params.{k}": v for k, v in t.parameters.items()}} for t in self.trials]

    def to_dataframe(self) -> Any:
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("to_dataframe() needs pandas: pip install pandas") from None
        return pd.DataFrame(self.records())


ConfigLike = str | os.PathLike[str] | dict[str, Any] | ExperimentConfig
RootLike = str | os.PathLike[str] | None  # where experiments are: a folder, as a path or text


def _as_config(config: ConfigLike) -> tuple[ExperimentConfig, str | None]:
    if isinstance(config, ExperimentConfig):
        return config, None
    if isinstance(config, dict):
        return parse_config(config), None
    path = os.fspath(config)
    return load_config(path), os.path.abspath(path)


def run_experiment(config: ConfigLike) -> ExperimentResult:
    """Run an experiment to its end in this process and return its result."""
    cfg, path = _as_config(config)
    experiment_id, exp_dir = create_warm_started(cfg, path)
    return run_to_its_end(path, experiment_id, exp_dir.parent)


def run_to_its_end(config_path: str | None, experiment_id: str, root: Path) -> ExperimentResult:
    """Run the stored experiment here and return its result. A failed call to the Prefect API that ended
    the run (its final state, say, with the API gone) is one warning when the experiment's record says it
    ended, and its result is returned (Prefect's engine's own record of it, a traceback, is left out);
    what Prefect queued for that API is dropped after a bound, not tried for minutes in the background and
    at exit. Raises what ended a run that did not end."""
    from ..server.api_choice import no_telemetry_notice, uses_kept_server

    if uses_kept_server():  # before Prefect's first import in a script or a notebook
        no_telemetry_notice()
    from ..flows.api_outage import EXIT_DRAIN_SECONDS, api_failure_line, drop_what_cannot_reach
    from ..flows.experiment import final_status, run_experiment_flow

    engine_log, leave_out = logging.getLogger("prefect.flow_runs"), _NotAFailedApiCall()
    engine_log.addFilter(leave_out)
    try:
        state = run_experiment_flow(config_path, experiment_id, str(root))
        status = final_status(state, experiment_id, root)
    except Exception as exc:
        line = api_failure_line(exc)
        if line is None:
            raise
        result = result_of(root, experiment_id)
        ended = result.status in EXPERIMENT_ENDED
        outcome = f"ended {result.status}, but" if ended else "did not end:"
        log.warning("experiment %s %s %s: what is left of its run's events and logs there is dropped after %.0f s",
                    experiment_id, outcome, line, EXIT_DRAIN_SECONDS)
        try:
            drop_what_cannot_reach(str(exc.request.url))  # type: ignore[attr-defined]
        except RuntimeError:  # a failure outside a request: no API to name
            pass
        if not ended:
            raise
        return result
    finally:
        engine_log.removeFilter(leave_out)
    return result_of(root, experiment_id, status)


class _NotAFailedApiCall(logging.Filter):
    """Leaves out Prefect's engine's error record, with its traceback, of a failed call to the Prefect API
    that ended a run: :func:`run_to_its_end` says it in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info is None or record.exc_info[1] is None:  # most records: nothing to look at
            return True
        from ..flows.api_outage import api_failure_line

        return api_failure_line(record.exc_info[1]) is None


def result_of(root: Path, experiment_id: str, status: str | None = None) -> ExperimentResult:
    store = open_store(root, experiment_id)
    try:
        trials = store.trials()
        record = store.experiment()
    finally:
        store.close()
    objectives = multi_objective(record)
    if objectives is not None:
        return ExperimentResult(experiment_id, status or record.status, root / experiment_id, trials, None,
                                pareto_set(trials, objectives))
    return ExperimentResult(experiment_id, status or record.status, root / experiment_id, trials,
                            best_trial(trials, maximizes(record)))


def resume_experiment(experiment_id: str, root: RootLike = None, *, max_trial_number: int | None = None,
                      max_experiment_duration: str | int | None = None) -> ExperimentResult:
    """Resume an experiment in this process until it ends, as ``trialflow resume --foreground`` does, and
    return its result: a stopped or crashed one goes on; a finished one continues with a larger
    ``max_trial_number`` or ``max_experiment_duration`` (totals, as ``resume --trialnum/--duration``),
    its tuner told every trial it has. Raises ``ExperimentNotFound``, ``UpdateError`` (a budget that
    lets nothing more run) and ``ExperimentRunning`` (a ``RuntimeError``) when its controller still runs."""
    from .control import prepare_resume

    base, store = find_experiment(experiment_id, root)
    try:
        for line in prepare_resume(store, max_trial_number, max_experiment_duration):
            log.info(line)
    finally:
        store.close()
    return run_to_its_end(None, experiment_id, base)


def stop_experiment(experiment_id: str, root: RootLike = None, wait: float = 60.0) -> ExperimentResult:
    """Stop an experiment (its running trials end USER_CANCELED, it ends STOPPED unless it had already
    ended) and return its result. Raises ``ExperimentNotFound``; warnings (a trial the platform could
    not stop) go to the ``trialflow`` logger."""
    from .control import stop_experiment as stop

    base, store = find_experiment(experiment_id, root)
    try:
        for warning in stop(store, base, wait):
            log.warning(warning)
    finally:
        store.close()
    return result_of(base, experiment_id)


def kill_trial(experiment_id: str, trial_id: str, root: RootLike = None) -> TrialRecord:
    """Cancel one trial (USER_CANCELED; a trial that already ended keeps its status) and return its
    record. Raises ``ExperimentNotFound``, and ``KeyError`` for a trial the experiment does not have."""
    from .control import kill_trial as kill

    base, store = find_experiment(experiment_id, root)
    try:
        for warning in kill(store, base, trial_id)[1]:
            log.warning(warning)
        return store.trial(trial_id)
    finally:
        store.close()


def update_experiment(experiment_id: str, what: str, value: str | int, root: RootLike = None) -> int:
    """Set a running experiment's ``concurrency``, ``trialnum`` or ``duration`` (``'2h'``, seconds), as
    ``trialflow update`` does; returns the stored number. Raises ``ExperimentNotFound`` and
    ``UpdateError`` (a bad value, named with what is allowed)."""
    from .control import update_experiment as update

    _, store = find_experiment(experiment_id, root)
    try:
        return update(store, what, value)
    finally:
        store.close()


def update_search_space(experiment_id: str, space: dict[str, Any], root: RootLike = None) -> None:
    """Replace a running experiment's search space (later trials use it). Raises
    ``ExperimentNotFound`` and ``SearchSpaceError``."""
    from .control import update_search_space as update

    _, store = find_experiment(experiment_id, root)
    try:
        update(store, space)
    finally:
        store.close()


def delete_experiment(experiment_id: str, root: RootLike = None) -> Path:
    """Delete a finished experiment's folder (trials, logs, store), as ``trialflow experiment delete``
    does; returns the folder. Raises ``ExperimentNotFound``, and ``ExperimentRunning`` (a
    ``UserError``) while it runs."""
    from .control import delete_experiment as delete

    base, store = find_experiment(experiment_id, root)
    return delete(store, base)  # closes the store


class ExperimentSession:
    """An experiment opened for a user's own flow: the tasks of ``trialflow.tasks`` find it by
    :attr:`id`. A trial added by hand is recorded like a suggested one and, when it ends, told to the
    tuner as an imported result (so a later ``suggest_parameters`` learns from it)."""

    def __init__(self, ctx: ExperimentContext) -> None:
        self._ctx = ctx
        self.id = ctx.experiment_id
        self.directory = ctx.experiment_dir

    def add_trial(self, parameters: dict[str, Any]) -> str:
        """Record a trial with hand-picked ``parameters`` (they must lie in the search space); returns its
        id for ``submit_trial``."""
        raw = self._ctx.config.raw_values(parameters)
        trial_id = new_trial_id()
        sequence = self._ctx.store.take_sequence()
        hand_picked = -1 - sequence  # negative, as imported trials: never a tuner's parameter id
        self._ctx.store.add_trial(trial_id, sequence, hand_picked, dict(parameters), raw,
                                  str(self.directory / "trials" / trial_id))
        self._ctx.adopted[hand_picked] = raw  # its end is replayed to the tuner
        return trial_id

    def trial(self, trial_id: str) -> TrialRecord:
        return self._ctx.store.trial(trial_id)


@contextmanager
def prefect_api() -> Iterator[str | None]:
    """Inside the block, Prefect calls of this process (saving a credentials block, reading runs) go
    to the Prefect API experiments report to: a configured ``PREFECT_API_URL`` as it is (yields None),
    else trialflow's kept local server, started when none runs (yields its API URL). So a notebook
    saves ``SSHCredentials(...).save("gpu2-login")`` where its experiments will look for it::

        with trialflow.prefect_api():
            SSHCredentials(host="gpu2", username="me", password="...").save("gpu2-login")

    (in a notebook's cell ``await SSHCredentials(...).save("gpu2-login")``: where an event loop runs,
    Prefect's ``save`` hands back a coroutine, which saves nothing until awaited).

    Raises :class:`~trialflow.server.kept_server.ServerError` when the kept server cannot start or the
    configured API does not answer."""
    from ..flows.run_api import experiment_api

    with experiment_api() as url:
        yield url


@contextmanager
def experiment_session(config: ConfigLike) -> Iterator[ExperimentSession]:
    """Create an experiment from ``config``, prepare its training service and open it for the task
    library; on exit the experiment is DONE (ERROR when the block raised) and the service is closed.
    Use it inside a Prefect ``@flow``::

        with trialflow.experiment_session("config.yml") as exp:
            upload_code(exp.id, "code/")
            trial = exp.add_trial({"lr": 0.01})
            submit_trial(exp.id, trial)
            poll_trial(exp.id, trial)
    """
    cfg, path = _as_config(config)
    experiment_id, exp_dir = create_warm_started(cfg, path)
    store = open_store(exp_dir.parent, experiment_id)
    status, message = ExperimentStatus.ERROR, None
    try:
        with open_context(experiment_id, exp_dir, cfg, store) as ctx:
            store.set_experiment(status=ExperimentStatus.RUNNING)
            try:
                yield ExperimentSession(ctx)
                status = ExperimentStatus.DONE
            except BaseException as exc:
                message = f"{type(exc).__name__}: {exc}"
                raise
    finally:
        end_experiment(store, status, message)
        store.close()
