"""The experiment store's records (a trial, an experiment, a metric) and how a table row becomes one, the
keys of its controls, its schema version and its one-line read error: what reading a store needs, free of
SQLAlchemy, so that the read-only commands (``trial ls``, ``experiment export``, ``experiment list``) can
read an embedded store with the standard library's ``sqlite3`` (:mod:`trialflow.records.store_reader`) while every
write goes through :class:`~trialflow.records.store.ExperimentStore`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from ..foundation.status import TERMINAL
from ..foundation.user_errors import UserError

SCHEMA_VERSION = 3  # the tables' version (trialflow.records.store_schema: its upgrade steps)
DB_RELATIVE_PATH = Path("db") / "trialflow.sqlite"  # an embedded store's file in its experiment's folder
STOPPING = "stopping"  # in a stored handle, beside its fields: a stop recorded, not yet settled


ImportedItem = tuple[dict[str, Any], dict[str, Any], Any]
"""One imported result (NNI's ``importData`` item): its parameters, its raw values and its value."""


class Control(str, Enum):
    """The keys of an experiment's controls: what the CLI, the API and the controller ask of a run
    through the store (read by the controller every loop tick)."""

    STOP = "stop"  # trialflow stop: the run ends STOPPED
    KILL = "kill"  # trialflow trial kill: the ids of trials to cancel
    TRIAL_CONCURRENCY = "trial_concurrency"  # update concurrency: replaces trialConcurrency
    MAX_TRIAL_NUMBER = "max_trial_number"  # update trialnum, resume --trialnum: replaces maxTrialNumber
    MAX_EXPERIMENT_DURATION = "max_experiment_duration"  # update duration, resume --duration (seconds)
    SEARCH_SPACE = "search_space"  # update searchspace: replaces searchSpace
    ELAPSED_SECONDS = "elapsed_seconds"  # the run time spent by earlier runs (maxExperimentDuration counts it)
    DASHBOARD_URL = "dashboard_url"  # set by trialflow dashboard while one serves
    WEB_PORT = "web_port"  # {port, pid, start_time}: NNI's web UI port, held by the process that started it
    CHANGED_FIELDS = "changed_fields"  # top-level config fields trialflow set itself (update, overrides)


class StoreUnreadable(UserError, RuntimeError):
    """An experiment store that cannot be opened or read (a damaged file, an unreachable database); the
    message is one line naming it and what to do."""


def store_unreadable(location: str, error: BaseException, embedded: bool) -> StoreUnreadable:
    """The one-line error for a store at ``location`` (a file, or a URL without its password) whose
    database raised ``error``."""
    reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
    if embedded:
        return StoreUnreadable(f"the experiment store {location} cannot be read ({reason}): the file is damaged; "
                               "restore it from a backup, or remove its experiment folder")
    return StoreUnreadable(f"the experiment store {location} cannot be read ({reason}): check that the database "
                           "runs and the URL and password are right")


@dataclass
class TrialRecord:
    id: str
    sequence: int
    parameter_id: int
    parameters: dict[str, Any]
    raw: dict[str, Any]
    status: str
    handle: dict[str, Any] | None
    exit_code: int | None
    message: str | None
    log_dir: str | None
    submit_time: float
    start_time: float | None
    end_time: float | None
    final: Any = None

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def stopping(self) -> bool:
        """Its stop is recorded (:meth:`ExperimentStore.record_stop`) but not settled: the controller
        that stopped it ended before the kill was over, and the next one finishes the stop."""
        return bool(self.handle and self.handle.get(STOPPING))


@dataclass
class ExperimentRecord:
    id: str
    name: str | None
    config: dict[str, Any]
    config_path: str | None
    status: str
    message: str | None
    start_time: float | None
    end_time: float | None
    controller_pid: int | None
    next_sequence: int
    controls: dict[str, Any] = field(default_factory=dict)
    optimize_mode: str | None = None  # None only for experiments created before it was stored
    best_trial: str | None = None
    flow_run_id: str | None = None
    prefect_api: str | None = None
    pareto: list[str] | None = None  # a multi-objective experiment's Pareto set (trial ids), recorded at its end


@dataclass(frozen=True)
class Metric:
    trial_id: str
    type: str  # "PERIODICAL" | "FINAL"
    sequence: int
    value: Any
    time: float = 0.0


# control -> the config field whose value it replaces (what ``update`` changes)
CONTROLLED_FIELDS: dict[str, str] = {
    Control.TRIAL_CONCURRENCY: "trialConcurrency", Control.MAX_TRIAL_NUMBER: "maxTrialNumber",
    Control.MAX_EXPERIMENT_DURATION: "maxExperimentDuration", Control.SEARCH_SPACE: "searchSpace"}


def config_in_force(record: ExperimentRecord) -> tuple[dict[str, Any], dict[str, Any]]:
    """The experiment's config with the values ``update`` set in place of the created ones (in force
    now, or at the next run of a stopped experiment), and the controls left over (run state)."""
    config = dict(record.config)
    rest = {}
    for key, value in record.controls.items():
        field = CONTROLLED_FIELDS.get(key)
        if field is None:
            rest[key] = value
        else:
            config[field] = value
            if field == "searchSpace":
                config.pop("searchSpaceFile", None)
    return config, rest


def trial_record(m: Any) -> TrialRecord:
    """A ``trials`` row (by column name) as a record."""
    return TrialRecord(m["id"], m["sequence"], m["parameter_id"], json.loads(m["parameters"]),
                       json.loads(m["raw"]), m["status"], json.loads(m["handle"]) if m["handle"] else None,
                       m["exit_code"], m["message"], m["log_dir"], m["submit_time"], m["start_time"],
                       m["end_time"], json.loads(m["final"]) if m["final"] is not None else None)


def experiment_record(m: Any, controls: dict[str, Any]) -> ExperimentRecord:
    """An ``experiments`` row (by column name) and the experiment's controls as a record."""
    return ExperimentRecord(m["id"], m["name"], json.loads(m["config"]), m["config_path"], m["status"],
                            m["message"], m["start_time"], m["end_time"], m["controller_pid"],
                            m["next_sequence"], controls, m["optimize_mode"], m["best_trial"],
                            m["flow_run_id"], m["prefect_api"],
                            json.loads(m["pareto"]) if m["pareto"] is not None else None)


def metric_record(m: Any) -> Metric:
    """A ``metrics`` row (by column name) as a record."""
    return Metric(m["trial_id"], m["type"], m["sequence"], json.loads(m["value"]), m["time"])
