"""The one interface every training platform implements (docs/architecture.md#the-trainingservice-contract).

Plain Python, no Prefect: ``tasks/trials.py`` wraps it in tasks, retrying only
:class:`TransientPlatformError`. Lifecycle of one experiment's service object:
``prepare()`` once (fail fast with a hint), ``upload_code()`` once per code bundle, then per trial
``submit()`` (returns at once; the handle is JSON-serialisable and stored so a resumed experiment can
re-attach), ``poll()`` until a terminal status, ``cancel()`` at any time (idempotent), and
``close()`` at the end.
"""

from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ..foundation.status import TrialStatus
from ..trial.protocol import ATTEMPT_ENV, OUTPUT_FILES, REPORTED_ENV
from ..trial.records import MetricRecord
from .errors import LostHandleError, PlatformError, TransientPlatformError
from .report_desk import ReportDesk

if TYPE_CHECKING:
    from ..config.sections.base import TrainingServiceConfig

ConfigT = TypeVar("ConfigT", bound="TrainingServiceConfig")


@dataclass(frozen=True)
class TrialSpec:
    """Everything a platform needs to run one trial; parameters are bound to this trial alone."""

    experiment_id: str
    trial_id: str
    sequence: int
    parameter_id: int
    parameters: dict[str, Any]
    command: str
    code_dir: Path
    gpu_number: int | None = None
    attempt: int = 0  # resubmissions after infrastructure interruptions; platforms name each run apart
    reported: int = 0  # intermediate results stored before this run: its own number on from there

    def attempt_env(self) -> dict[str, str]:
        """What tells the trial's command which run it is and where its intermediate results go on
        (every platform adds it to the trial's environment; the checkpoint folder is the platform's)."""
        return {ATTEMPT_ENV: str(self.attempt), REPORTED_ENV: str(self.reported)}

    def parameter_record(self) -> str:
        """The exact ``parameter.cfg`` content NNI trial code expects (docs/nni.md#parameters)."""
        return json.dumps({"parameter_id": self.parameter_id, "parameter_source": "algorithm",
                           "parameters": self.parameters, "parameter_index": 0})


@dataclass(frozen=True)
class TrialHandle:
    trial_id: str
    platform: str
    data: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"trial_id": self.trial_id, "platform": self.platform, "data": self.data}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TrialHandle:
        return cls(raw["trial_id"], raw["platform"], dict(raw["data"]))


SERVICE_KEY = "service"  # in a hybrid trial's handle data: the member service it runs on


def service_name(handle: dict[str, Any] | None) -> str | None:
    """The member a hybrid trial ran on (None for a single-service experiment or an unsubmitted trial)."""
    return (handle or {}).get("data", {}).get(SERVICE_KEY)


@dataclass
class TrialUpdate:
    """The result of one poll: status, metrics new since the cursor, the next cursor."""

    status: TrialStatus
    metrics: list[MetricRecord] = field(default_factory=list)
    cursor: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None
    message: str | None = None
    errors: list[str] = field(default_factory=list)  # rejected metric lines, reported not fatal
    # Set (with status WAITING) when an infrastructure event -- preemption, node loss, a requeue --
    # ended this run of the trial: not the trial's failure. The flow resubmits it with the same
    # parameters (``TrialSpec.attempt`` + 1); see :meth:`TrainingService.interrupted`.
    interrupted: str | None = None


INTERRUPTION_NOTE = "interrupted; run again as attempt"


def interruption_note(attempt: int, why: str) -> str:
    """The event an interruption adds to the trial's history: the run it starts, and the platform's reason."""
    return f"{INTERRUPTION_NOTE} {attempt}: {why}"


def stored_attempt(handle: dict[str, Any] | None) -> int:
    """The attempt a stored trial handle (``TrialRecord.handle``) names: 0 until an interruption."""
    return int(((handle or {}).get("data") or {}).get("attempt", 0))


def attempt_of(message: str | None) -> int | None:
    """The attempt an event of :func:`interruption_note` started (None for any other event)."""
    if not message or not message.startswith(INTERRUPTION_NOTE + " "):
        return None
    number = message[len(INTERRUPTION_NOTE) + 1:].split(":", 1)[0]
    return int(number) if number.isdigit() else None


@dataclass(frozen=True)
class CodeRef:
    """Where an uploaded code bundle lives on the platform (local: the directory itself)."""

    location: str
    content_hash: str | None = None


__all__ = ["CodeRef", "LostHandleError", "PlatformError", "TrainingService", "TransientPlatformError",
           "TrialHandle", "TrialSpec", "TrialStatus", "TrialUpdate"]


class TrainingService(ABC, Generic[ConfigT]):
    """A platform's service, typed by its config model (``TrainingService[RemoteConfig]``)."""

    platform: str = ""
    config: ConfigT

    @abstractmethod
    def prepare(self) -> None:
        """Validate credentials, connectivity and resources once; raise PlatformError with a hint."""

    @abstractmethod
    def upload_code(self, code_dir: Path) -> CodeRef:
        """Make the code directory available to trials; idempotent per content."""

    def code_directory(self) -> Path:
        """The code directory its trials run: this service's ``trialCodeDirectory``."""
        return Path(self.config.trial_code_directory)

    def trial_spec(self, experiment_id: str, trial_id: str, sequence: int, parameter_id: int,
                   parameters: dict[str, Any]) -> TrialSpec:
        """The spec of a stored trial to :meth:`submit` here: the command, code directory and GPUs of
        this service's own config section. Raises :class:`PlatformError` when the service cannot take
        the trial now (a hybrid experiment whose members are all full: transient)."""
        cfg = self.config
        return TrialSpec(experiment_id, trial_id, sequence, parameter_id, parameters, cfg.trial_command,
                         self.code_directory(), cfg.trial_gpu_number)

    def concurrency_cap(self) -> tuple[str, int] | None:
        """The Prefect global concurrency limit its trials share with other experiments (name, slots),
        when the config asks for one (``platformConcurrency``)."""
        cfg = self.config
        return (cfg.cap_name, cfg.platform_concurrency) if cfg.platform_concurrency else None

    @abstractmethod
    def submit(self, spec: TrialSpec, code: CodeRef) -> TrialHandle:
        """Start (or queue) the trial and return at once."""

    @abstractmethod
    def poll(self, handle: TrialHandle, cursor: dict[str, Any]) -> TrialUpdate:
        """Non-blocking: current status and metrics after ``cursor``."""

    @abstractmethod
    def cancel(self, handle: TrialHandle, reason: TrialStatus) -> None:
        """Stop the trial; a finished or unknown trial is not an error."""

    def adopt(self, handle: TrialHandle) -> None:
        """Take over a trial started by an earlier controller (resume), e.g. re-register its resources
        (default: nothing to do)."""
        return None

    def wait(self, handle: TrialHandle, timeout: float) -> None:
        """Block up to ``timeout`` seconds or until the trial may have changed (default: sleep)."""
        time.sleep(timeout)

    # Set by a service whose :meth:`wait_or_woken` returns as soon as its wake-up descriptor is readable:
    # its follower then waits longer while the trial is quiet, up to this many seconds, and is woken
    # at once by a cancel or the experiment's stop. None: the follower polls every poll interval.
    quiet_poll_seconds: float | None = None

    def wait_or_woken(self, handle: TrialHandle, timeout: float, wakeup_fd: int) -> None:
        """As :meth:`wait`, returning also once ``wakeup_fd`` is readable (a service that watches it
        sets :attr:`quiet_poll_seconds`; by default it is not watched)."""
        self.wait(handle, timeout)

    def use_report_desk(self, desk: ReportDesk) -> bool:
        """Give trials submitted from now on the controller's report desk (:mod:`.report_desk`), where
        they ask at report time whether the assessor stops them; True when this platform's trials can
        reach it (default: no, they are stopped when their follower polls)."""
        return False

    def logs(self, handle: TrialHandle, tail: int | None = None) -> dict[str, str]:
        """The trial's log files by name (``trial.stdout``, ``trial.stderr``, ``trial.log``), the last
        ``tail`` bytes of each when given; empty when not available."""
        return {}

    output_read_seconds: float = 5.0  # how often a trial's follower asks for new output (fetching may cost)

    def read_output(self, handle: TrialHandle, offsets: dict[str, int]) -> dict[str, bytes]:
        """The trial's stdout/stderr written after ``offsets`` (bytes per file name), by file name.
        Default: from :meth:`logs` (whole files: services that can read from an offset override it).
        Raises PlatformError like :meth:`logs`."""
        out = {}
        for name, text in self.logs(handle).items():
            if name in OUTPUT_FILES:
                data = text.encode("utf-8", "replace")
                if len(data) > offsets.get(name, 0):
                    out[name] = data[offsets.get(name, 0):]
        return out

    def interrupted(self, handle: TrialHandle, why: str, records: list[MetricRecord] | None = None,
                    cursor: dict[str, Any] | None = None) -> TrialUpdate:
        """The update of a trial whose run an infrastructure event ended (``why``): to be resubmitted
        with the same parameters while this section's ``maxInterruptions`` allows, FAILED (naming the
        events) once it is used up. The count lives in the handle (``attempt``), apart from failures;
        the tuner sees only the trial's final outcome."""
        used = int(handle.data.get("attempt", 0))
        limit = self.config.max_interruptions
        if used >= limit:
            return TrialUpdate(TrialStatus.FAILED, records or [], cursor or {}, None,
                               f"{why}; the trial was already resubmitted {used} times after interruptions "
                               f"(maxInterruptions: {limit})")
        return TrialUpdate(TrialStatus.WAITING, records or [], cursor or {}, interrupted=why)

    def abandon(self, trial_id: str) -> None:
        """The trial's follower is done with it (ended, or its submission or polling failed for
        good): release what it still holds here; idempotent (default: nothing)."""
        return None

    def capacity(self) -> int | None:
        """The most trials this service can run at once, when it knows (default: no limit of its own)."""
        return None

    def follow_concurrency(self, concurrency: int) -> None:
        """The experiment's ``trialConcurrency`` in force: told when the experiment loop starts and
        each time ``trialflow update concurrency`` changes it (default: nothing to adjust)."""
        return None

    def output_folder(self, handle: TrialHandle, name: str) -> Path | None:
        """The folder ``name`` of the trial's ``NNI_OUTPUT_DIR`` (e.g. ``tensorboard``) on this
        machine, copied here first when the trial runs elsewhere; None when the service cannot
        reach it (default)."""
        return None

    def clean(self, dry_run: bool = False) -> list[str]:
        """Remove what trialflow made on the platform for every experiment (``trialflow platform clean``):
        code bundles, runtimes, trial folders, each marked as trialflow's when made
        (:mod:`~trialflow.platforms.ownership`), never anything else; returns what was (with ``dry_run``:
        would be) removed. Running trials there lose their folders: the caller makes sure none run.
        Default: nothing is kept outside the experiment folder. Raises :class:`PlatformError` when the
        platform cannot be reached or its working directory is not one trialflow may clean."""
        return []

    def close(self) -> None:
        """Release connections and clients; running trials are not touched."""
        return None
