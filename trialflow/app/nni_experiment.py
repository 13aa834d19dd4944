"""NNI's Python API, ``from nni.experiment import Experiment``, on trialflow: the scripts and notebooks of
NNI's quickstart (``Experiment('local')``, ``experiment.config.<field> = ...``, ``experiment.run(8080)``,
``experiment.stop()``) run unchanged, and its queries (``get_status``, ``export_data``,
``get_job_metrics``, ``list_trial_jobs``, ...) read the experiment's record.

Lifecycle: ``Experiment(config_or_platform, id=None)`` holds a config (:mod:`trialflow.config.nni_objects`)
and an id, a new one made at once as NNI makes it, or with ``Experiment(None, id=...)`` one made earlier
(to resume, view or query). :meth:`Experiment.run` creates the experiment and runs it in this process
until it ends; :meth:`Experiment.start` creates it and runs it in a background controller, stopped when
this process exits (as NNI stops its manager then) unless ``run_mode=RunMode.Detach``;
:meth:`Experiment.stop` stops it while it runs and does nothing after its end. The experiment lives where
trialflow's experiments live (``experiment_working_directory`` when set): ``trialflow`` commands and the
Prefect UI see it as any other.

``port``, NNI's web portal port, is the experiment's address while it runs, as in NNI:
``Experiment.connect(port)`` and ``trialflow stop --port`` find it there. Nothing listens on it: the
Prefect UI of the server the experiment reports to is its web UI (``trialflow server start --port``
chooses the kept server's port), and its address is printed.

A bad config or id raises :class:`~trialflow.foundation.user_errors.UserError` (a ``ConfigError`` for
the config) with one line naming what is wrong.
"""

from __future__ import annotations

import atexit
import json
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config.nni_objects import (
    AlgorithmConfig,
    AmlConfig,
    AzureBlobConfig,
    ConfigObject,
    CustomAlgorithmConfig,
    DlcConfig,
    ExperimentConfig,
    FrameworkAttemptCompletionPolicy,
    FrameworkControllerConfig,
    FrameworkControllerRoleConfig,
    K8sAzureStorageConfig,
    K8sNfsConfig,
    K8sStorageConfig,
    KubeflowConfig,
    KubeflowRoleConfig,
    LocalConfig,
    NfsConfig,
    OpenpaiConfig,
    RemoteConfig,
    RemoteMachineConfig,
    SharedStorageConfig,
    TrainingServiceConfig,
)
from ..foundation.status import EXPERIMENT_LIVE, ExperimentStatus
from ..foundation.user_errors import UserError

if TYPE_CHECKING:
    from ..records.store import ExperimentStore

# what ``nni.experiment`` gives (the config objects with the experiment)
__all__ = ["AlgorithmConfig", "AmlConfig", "AzureBlobConfig", "CustomAlgorithmConfig", "DlcConfig", "Experiment",
           "ExperimentConfig", "FrameworkAttemptCompletionPolicy", "FrameworkControllerConfig",
           "FrameworkControllerRoleConfig", "K8sAzureStorageConfig", "K8sNfsConfig", "K8sStorageConfig",
           "KubeflowConfig", "KubeflowRoleConfig", "LocalConfig", "NfsConfig", "OpenpaiConfig", "RemoteConfig",
           "RemoteMachineConfig", "RunMode", "SharedStorageConfig", "TrainingServiceConfig", "TrialHyperParameters",
           "TrialJob", "TrialMetricData", "TrialResult"]


class RunMode(Enum):
    """How :meth:`Experiment.start` runs it: ``Background`` and ``Foreground`` stop it when this
    process exits; ``Detach`` leaves it running."""

    Background = "background"
    Foreground = "foreground"
    Detach = "detach"


@dataclass
class TrialResult:
    """A finished trial: its parameters, its final result (as reported) and its id."""

    parameter: dict[str, Any]
    value: Any
    trialJobId: str  # noqa: N815 -- NNI's name


@dataclass
class TrialMetricData:
    """One reported result: ``type`` is ``PERIODICAL`` (intermediate) or ``FINAL``; ``timestamp`` in ms."""

    timestamp: int
    trialJobId: str  # noqa: N815
    parameterId: int  # noqa: N815
    type: str
    sequence: int
    data: Any


@dataclass
class TrialHyperParameters:
    parameter_id: int
    parameter_source: str
    parameters: dict[str, Any]
    parameter_index: int


@dataclass
class TrialJob:
    """A trial: status, parameters, times (ms) and its final result."""

    trialJobId: str  # noqa: N815
    status: str
    hyperParameters: list[TrialHyperParameters]  # noqa: N815
    logPath: str | None  # noqa: N815
    startTime: int | None  # noqa: N815
    endTime: int | None  # noqa: N815
    finalMetricData: list[TrialMetricData]  # noqa: N815
    stderrPath: str | None  # noqa: N815
    sequenceId: int  # noqa: N815
    message: str | None


def _metadata(root: Path, record: Any) -> dict[str, Any]:
    from ..experiments import platform_of, shown_port
    from ..experiments.trial_jobs import ms

    return {"id": record.id, "experimentName": record.name, "status": record.status, "port": shown_port(record),
            "platform": platform_of(record), "logDir": str(root / record.id), "startTime": ms(record.start_time),
            "endTime": ms(record.end_time), "pid": record.controller_pid if record.status in EXPERIMENT_LIVE else None}


def _metric_data(record: dict[str, Any]) -> TrialMetricData:
    """One of :func:`~trialflow.experiments.trial_jobs.metric_records`' results, decoded as NNI's API does."""
    return TrialMetricData(**{**record, "data": json.loads(json.loads(record["data"]))})


def _trial_job(job: dict[str, Any]) -> TrialJob:
    """One of :func:`~trialflow.experiments.trial_jobs.trial_jobs`, decoded as NNI's API does."""
    return TrialJob(job["trialJobId"], job["status"], [TrialHyperParameters(**json.loads(p))
                                                       for p in job["hyperParameters"]],
                    job.get("logPath"), job.get("startTime"), job.get("endTime"),
                    [_metric_data(m) for m in job.get("finalMetricData", [])], job.get("stderrPath"),
                    job["sequenceId"], job.get("message"))


class Experiment:
    """An NNI experiment run by trialflow (see the module doc)."""

    def __init__(self, config_or_platform: ExperimentConfig | ConfigObject | dict[str, Any] | str | list[str] | None,
                 id: str | None = None) -> None:  # noqa: A002 -- NNI's name
        from ..foundation.ids import looks_like_experiment_id, new_experiment_id

        if id is not None and not looks_like_experiment_id(id):  # never a path, nor a name trialflow cannot find
            raise UserError(f"experiment id {id!r} is not one trialflow makes: its ids are 8 lowercase letters and "
                            "digits (leave id out to have one made)")
        if isinstance(config_or_platform, str | list):
            self.config: Any = ExperimentConfig(config_or_platform)
        else:
            self.config = config_or_platform
        self.id = id if id is not None else new_experiment_id()
        self.port: int | None = None
        self._controller: tuple[int, int | None] | None = None  # the background controller begun here (pid, start)
        self._viewing = False  # view(non_blocking=True) until stop() or a run: NNI's VIEWED

    # -- running --------------------------------------------------------------------------------------

    def run(self, port: int = 8080, wait_completion: bool = True, debug: bool = False) -> bool | None:
        """Create the experiment and run it: in this process until it ends (True when it ends DONE or
        STOPPED, False when ERROR), or with ``wait_completion=False`` as :meth:`start` does (None). A
        Ctrl-C or a notebook's interrupt stops it (its running trials end USER_CANCELED) and returns None.
        Raises ``UserError`` for a bad config or id."""
        if not wait_completion:
            self.start(port, debug)
            return None
        from .api import run_to_its_end

        root = self._create(debug)
        self._take_port(root, port)
        return self._outcome(lambda: run_to_its_end(None, self.id, root))

    def start(self, port: int = 8080, debug: bool = False, run_mode: RunMode = RunMode.Background) -> None:
        """Create the experiment and run it in a background controller; returns once its flow run has
        begun, printing its Prefect UI page. Raises ``UserError`` for a bad config or id, or when the
        controller ends before the run begins (naming what it recorded)."""
        root = self._create(debug)
        self._take_port(root, port)
        self._in_background(root, None, run_mode)

    def resume(self, port: int = 8080, wait_completion: bool = True, debug: bool = False) -> bool | None:
        """Resume the experiment ``id`` names (stopped or crashed: its counts kept, running trials
        re-attached), in this process or (``wait_completion=False``) in the background; returns as
        :meth:`run`. Raises ``ExperimentNotFound`` and ``ExperimentRunning``."""
        named: Any = self
        if isinstance(named, str):  # NNI 2's Experiment.resume(id), which NNI 3 still takes
            return Experiment(None, id=named).resume(port, wait_completion, debug)
        base, earlier_run = self._prepare_resume(port)
        if not wait_completion:
            self._in_background(base, earlier_run, RunMode.Background)
            return None
        from .api import run_to_its_end

        return self._outcome(lambda: run_to_its_end(None, self.id, base))

    def run_or_resume(self, port: int = 8080, wait_completion: bool = True, debug: bool = False) -> bool | None:
        """:meth:`resume` when an experiment with this id exists (:meth:`has_checkpoint`), else :meth:`run`;
        returns and raises as they do."""
        if self.has_checkpoint():
            return self.resume(port, wait_completion, debug)
        return self.run(port, wait_completion, debug)

    def has_checkpoint(self) -> bool:
        """An experiment with this id is known here (it can be resumed and viewed)."""
        from ..experiments import ExperimentNotFound

        try:
            with self._records():
                return True
        except ExperimentNotFound:
            return False

    def load_checkpoint(self) -> None:
        """The known experiment's config, as in force, becomes this object's when it has none; a config it
        has is kept, with a warning when it differs (:meth:`resume` runs the experiment's own). Raises
        ``ExperimentNotFound``."""
        from ..records.store_records import config_in_force

        with self._records() as (_, records):
            stored = config_in_force(records.experiment())[0]
        if self.config is None:
            self.config = stored
            return
        from ..config import ConfigError, parse_config

        mine = self.config.json() if isinstance(self.config, ConfigObject) else self.config
        try:
            ours = mine if not isinstance(mine, dict) else parse_config(mine)
            differs = ours.model_dump() != parse_config(stored).model_dump()
        except (ConfigError, TypeError, ValueError):
            differs = True
        if differs:
            warnings.warn(f"experiment {self.id} has a stored config other than this object's; resume() runs the "
                          "stored one (`trialflow experiment show` prints it)", stacklevel=2)

    def save_checkpoint(self) -> None:
        """Nothing to do: the experiment's record is saved as it runs."""

    def _prepare_resume(self, port: int) -> tuple[Path, str | None]:
        """Ready the experiment's next run on ``port`` (``prepare_resume``); returns its working directory
        and its earlier flow run. Raises ``ExperimentNotFound`` and ``ExperimentRunning``, each with
        nothing changed."""
        from ..experiments import find_experiment
        from .control import prepare_resume

        base, store = find_experiment(self.id)
        try:
            earlier_run = store.experiment().flow_run_id
            prepare_resume(store)
            self._hold_port(store, port)
        finally:
            store.close()
        return base, earlier_run

    def stop(self) -> None:
        """Stop the experiment while it runs (its running trials end USER_CANCELED, it ends STOPPED); after
        its end, only give up its port (:meth:`connect` no longer finds it there); nothing before it was
        created."""
        from ..experiments import ExperimentNotFound
        from .api import stop_experiment

        atexit.unregister(self.stop)
        self._viewing = False
        try:
            status = self.get_status()
        except ExperimentNotFound:
            return
        if status in EXPERIMENT_LIVE or self._launched_runs():
            stop_experiment(self.id)
            self._wait_while(self._launched_runs)  # one still starting ends at its first look
            if self.get_status() == ExperimentStatus.STOPPED:
                print(f"experiment {self.id} stopped")
        else:
            from ..experiments import find_experiment
            from .control import release_web_port

            _, store = find_experiment(self.id)
            try:
                release_web_port(store)
            finally:
                store.close()
        self.port = None

    def view(self, port: int = 8080, non_blocking: bool = False) -> Experiment:
        """Print where the experiment's runs are in the Prefect UI (any experiment, running or ended, is
        viewable there) and its status; returns this object, which with ``non_blocking`` is viewing it as
        NNI's is: its :meth:`get_status` is ``VIEWED`` while the experiment does not run, until
        :meth:`stop` or a run. Raises ``ExperimentNotFound``."""
        from ..server.prefect_ui_pages import flow_run_page

        named: Any = self
        if isinstance(named, str):  # NNI 2's Experiment.view(id), which NNI 3 still takes
            return Experiment(None, id=named).view(port, non_blocking)

        with self._records() as (_, records):
            record = records.experiment()
        page = flow_run_page(record.prefect_api, record.flow_run_id) if record.flow_run_id else None
        print(f"experiment {self.id} {record.status}; Prefect UI: {page or 'no run recorded'}")
        self._viewing = non_blocking
        return self

    @classmethod
    def connect(cls, port: int) -> Experiment:
        """The experiment on ``port``: the port :meth:`start`, :meth:`run` or :meth:`resume` was given
        (also after the experiment's end, while the process that started it has not stopped it, as NNI's
        manager keeps its port), or the port of the Prefect server a running one reports to. Raises
        ``ExperimentNotFound`` when none is, or several are (naming them: ``Experiment(None, id=...)``
        takes one)."""
        from ..experiments import the_one_on_port

        experiment = cls(None, id=the_one_on_port(port).id)
        experiment.port = port
        return experiment

    def _create(self, debug: bool) -> Path:
        """The experiment made from ``config`` under ``id``; returns its working directory."""
        from ..config import parse_config
        from ..experiments.warm_start import create_warm_started

        if self.config is None:
            raise UserError(f"experiment {self.id} has no config here (Experiment(None, id=...) names one made "
                            "earlier): resume() or view() it, or give a config")
        data = self.config.json() if isinstance(self.config, ConfigObject) else self.config
        overrides = {"logLevel": "debug"} if debug else None
        cfg = data if not isinstance(data, dict) else parse_config(data, overrides=overrides)
        if (Path(cfg.experiment_working_directory).resolve() / self.id).exists():
            raise UserError(f"experiment {self.id} exists already: Experiment(None, id={self.id!r}).resume() "
                            "goes on with it; leave id out for a new one")
        experiment_id, exp_dir = create_warm_started(cfg, None, list(overrides or ()), experiment_id=self.id)
        print(f"experiment id: {experiment_id}  directory: {exp_dir}")
        return exp_dir.parent

    def _take_port(self, root: Path, port: int) -> None:
        """:meth:`_hold_port` for the experiment made under ``root``."""
        from ..experiments import open_store

        store = open_store(root, self.id)
        try:
            self._hold_port(store, port)
        finally:
            store.close()

    def _hold_port(self, store: ExperimentStore, port: int) -> None:
        """``port`` becomes the experiment's address, held by this process (``hold_web_port``), before a
        run through this object, which ends a :meth:`view`."""
        from .control import hold_web_port

        hold_web_port(store, port)
        self.port = port
        self._viewing = False

    def _in_background(self, root: Path, earlier_run: str | None, run_mode: RunMode) -> None:
        from ..trial.procs import process_start_time
        from .controller_launch import wait_for_run_page
        from .spare_controller import take_controller

        controller = take_controller()
        controller.run(self.id, root, None)
        self._controller = (controller.pid, process_start_time(controller.pid))
        if run_mode is not RunMode.Detach:
            atexit.register(self.stop)
        page, _ = wait_for_run_page(controller, self.id, root, earlier_run)
        # a resumed run reads as it ended until its controller has opened it
        self._wait_while(lambda: self.get_status() not in EXPERIMENT_LIVE and self._launched_runs())
        print(f"experiment {self.id} started in the background (pid {controller.pid})\n  Prefect UI: {page}")

    def _launched_runs(self) -> bool:
        """The background controller this object began last still runs."""
        from ..trial.procs import pid_alive

        return self._controller is not None and pid_alive(*self._controller)

    @staticmethod
    def _wait_while(condition: Any, timeout: float = 60.0) -> None:
        """Return once ``condition()`` is false, or after ``timeout`` seconds."""
        import time

        deadline = time.monotonic() + timeout
        while condition() and time.monotonic() < deadline:
            time.sleep(0.05)

    def _outcome(self, run: Any) -> bool | None:
        try:
            status = run().status
        except KeyboardInterrupt:  # recorded STOPPED, its trials stopped
            print(f"experiment {self.id} stopped by the interrupt")
            return None
        return status in (ExperimentStatus.DONE, ExperimentStatus.STOPPED)

    # -- queries --------------------------------------------------------------------------------------

    @contextmanager
    def _records(self) -> Iterator[tuple[Path, Any]]:
        """The working directory and the records of the experiment ``id`` names, closed on leaving.
        Raises ``ExperimentNotFound``."""
        from ..experiments import find_records

        base, records = find_records(self.id)
        try:
            yield base, records
        finally:
            records.close()

    def get_status(self) -> str:
        """INITIALIZED, RUNNING, DONE, STOPPED or ERROR; VIEWED on an object viewing an experiment that does
        not run (:meth:`view`). Raises ``ExperimentNotFound``."""
        with self._records() as (_, records):
            status = str(records.experiment().status)
        return "VIEWED" if self._viewing and status not in EXPERIMENT_LIVE else status

    def get_experiment_profile(self) -> dict[str, Any]:
        """NNI's experiment profile and the status: its id, config (``params``: NNI's v2 fields, as in
        force), start and end (ms; no end while it has none), run time so far (s), folder and the next
        trial's sequence number."""
        from ..experiments.trial_jobs import experiment_profile

        with self._records() as (base, records):
            record = records.experiment()
        return {**experiment_profile(record, str(base / record.id)), "status": record.status}

    def export_data(self) -> list[TrialResult]:
        """Each trial with a final result: its parameters, that result and its id."""
        with self._records() as (_, records):
            return [TrialResult(t.parameters, t.final, t.id) for t in records.trials() if t.final is not None]

    def get_job_metrics(self, trial_job_id: str | None = None) -> dict[str, list[TrialMetricData]]:
        """Every reported result by trial id (of one trial with ``trial_job_id``), in report order."""
        from ..experiments.trial_jobs import metric_records

        with self._records() as (_, records):
            by_trial = metric_records(records.trials(), records.metrics(trial_job_id))
        return {trial: [_metric_data(m) for m in reported] for trial, reported in by_trial.items()}

    def list_trial_jobs(self) -> list[TrialJob]:
        """Every trial, in submission order."""
        from ..experiments.trial_jobs import trial_jobs

        with self._records() as (_, records):
            jobs = trial_jobs(records.trials(), records.metrics(type="FINAL"))
        return [_trial_job(job) for job in jobs]

    def get_job_statistics(self) -> list[dict[str, Any]]:
        """How many trials are in each status: ``[{"trialJobStatus": ..., "trialJobNumber": ...}]``."""
        from collections import Counter

        with self._records() as (_, records):
            counts = Counter(t.status for t in records.trials())
        return [{"trialJobStatus": status, "trialJobNumber": number} for status, number in sorted(counts.items())]

    def get_all_experiments_metadata(self) -> list[dict[str, Any]]:
        """Every experiment trialflow knows here (as ``trialflow experiment list --all``): id, name,
        status, port (as nnictl's listing), platform, folder, start and end (ms) and the controller's pid
        while it runs."""
        from ..experiments import list_experiments

        return [_metadata(entry.root, entry.record) for entry in list_experiments()]

    def get_experiment_metadata(self, exp_id: str) -> dict[str, Any]:
        """:meth:`get_all_experiments_metadata`'s entry for ``exp_id``; empty when there is none."""
        return next((m for m in self.get_all_experiments_metadata() if m["id"] == exp_id), {})

    def get_trial_job(self, trial_job_id: str) -> TrialJob:
        """One trial (as :meth:`list_trial_jobs` gives it). Raises ``KeyError`` for an id it does not have."""
        for job in self.list_trial_jobs():
            if job.trialJobId == trial_job_id:
                return job
        raise KeyError(f"experiment {self.id} has no trial {trial_job_id}")

    # -- changes (as ``trialflow update`` and ``trialflow trial kill``) -----------------------------------

    def update_trial_concurrency(self, value: int) -> None:
        from .api import update_experiment

        update_experiment(self.id, "concurrency", value)

    def update_max_trial_number(self, value: int) -> None:
        """As :meth:`_update_budget` says. Raises ``ExperimentNotFound`` and ``UpdateError``."""
        self._update_budget("trialnum", value)

    def update_max_experiment_duration(self, value: str | int) -> None:
        """As :meth:`_update_budget` says. Raises ``ExperimentNotFound`` and ``UpdateError``."""
        self._update_budget("duration", value)

    def _update_budget(self, what: str, value: str | int) -> None:
        """Set the budget ``what`` (``trialnum`` or ``duration``) as ``trialflow update`` does. An
        experiment that ended DONE and is still on its web port (the process that started it holds it, as
        NNI's manager stays up after DONE) runs on in the background when the budget lets more run, as
        NNI's manager does (``run_on_budget``); the budget of any other ended experiment waits for
        :meth:`resume`."""
        from ..experiments import find_experiment, web_port
        from .api import update_experiment
        from .control import run_on_budget

        base, store = find_experiment(self.id)
        lines = None
        try:
            record = store.experiment()
            port = web_port(record)
            if port is not None and (lines := run_on_budget(store, what, value)) is not None:
                for line in lines:
                    print(line)
                self._hold_port(store, port)
        finally:
            store.close()
        if lines is None:
            update_experiment(self.id, what, value)
            return
        self._in_background(base, record.flow_run_id, RunMode.Background)

    def update_search_space(self, value: dict[str, Any]) -> None:
        from .api import update_search_space

        update_search_space(self.id, value)

    def kill_trial_job(self, trial_job_id: str) -> None:
        from .api import kill_trial

        kill_trial(self.id, trial_job_id)
