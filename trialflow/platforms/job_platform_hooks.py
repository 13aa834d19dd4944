"""What a job platform implements for :class:`~trialflow.platforms.job_platform.JobPlatformService`:
its share, roles and job names; the job (start, state, delete, logs); the metrics token's home (store,
read, delete); and how it tells that it ended a trial's run apart from the trial (an interruption:
an evicted or preempted pod, a lost node, a job run again in place). The methods with a body are
defaults a platform may keep."""

from __future__ import annotations

import signal
from abc import ABC, abstractmethod
from typing import Any

from .base import TrialStatus
from .mounted_share import MountedShare

KILLED_CODES = (128 + signal.SIGTERM, 128 + signal.SIGKILL)  # a run the platform's stop or kill ended


def stopped_run(state: dict[str, Any]) -> str | None:
    """How a trial's run ended by a stop, from its keeper's record ``state`` (``{}``: none), in words
    for an interruption's message: no end recorded (killed with its keeper), a stop signal trialflow
    did not send, or SIGTERM / SIGKILL; None for a run that ended otherwise."""
    if not state:
        return "its run recorded no end of its own"
    if state.get("stop_signal"):
        return "a stop signal trialflow did not send ended its run"
    if state.get("exit_code") in KILLED_CODES:
        return f"its run was killed (exit code {state['exit_code']})"
    return None


class JobPlatformHooks(ABC):
    """The platform's side of a job platform service (see the module)."""

    label = "the platform"  # how messages name the platform
    # set by the service's constructor, kept up to date from what job_status finds:
    _restarts: dict[str, str]  # job -> the platform's word, while it runs the job again in place
    _ended_by: dict[str, str]  # job -> the platform's word that it ended the job apart from the trial

    @abstractmethod
    def make_storage(self) -> MountedShare:
        """The share, from the platform's config."""

    @abstractmethod
    def roles(self) -> dict[str, str]:
        """Role name -> the command its replicas run (non-reuse); the first role is the primary one."""

    @abstractmethod
    def job_name(self, kind: str, ident: str) -> str:
        """The deterministic name of a trial's (``kind='trial'``) or an environment's (``'env'``) job."""

    @abstractmethod
    def start_job(self, name: str, ids: dict[str, str], commands: dict[str, list[str]], token_ref: str) -> None:
        """Create the job ``name`` unless it exists; ``commands`` holds each role's container command,
        ``token_ref`` where :meth:`store_token` put the metrics token (given to the job, never inline)."""

    @abstractmethod
    def job_status(self, name: str) -> tuple[TrialStatus, str | None] | None:
        """The platform's state table applied to the job: (status, message), None when it is gone."""

    @abstractmethod
    def delete_job(self, name: str) -> None:
        """Stop and delete the job and what was made for it; an unknown job is not an error."""

    @abstractmethod
    def store_token(self, name: str, token: str, ids: dict[str, str]) -> str:
        """Keep ``token`` with the platform as ``name`` unless one is stored; returns the stored one."""

    @abstractmethod
    def read_token(self, name: str) -> str | None:
        """The token stored as ``name``, None when there is none."""

    @abstractmethod
    def delete_token(self, name: str) -> None:
        """Forget the token stored as ``name`` (idempotent)."""

    def job_interruption(self, name: str, state: dict[str, Any]) -> str | None:
        """Why the platform ended the trial's run in job ``name`` apart from the trial (its pod evicted
        or preempted, its node lost), in the platform's own words; None when nothing but the trial
        ended it. ``state`` is the end the run's keeper recorded (``{}`` for none). Asked once the job
        (or the trial's reuse environment) ended, or while :meth:`job_restarting`. Default: what
        :meth:`job_status` found (:meth:`note_interruption`), else the platform runs the job again in
        place (:meth:`note_restart`) and the run recorded no end of its own, or one by a stop signal
        or SIGKILL (the platform stopping the replica)."""
        if name in self._ended_by:
            return self._ended_by[name]
        if name in self._restarts and (ended := stopped_run(state)) is not None:
            return f"{self.label} runs job {name} again ({self._restarts[name]}); {ended}"
        return None

    def note_interruption(self, name: str, why: str | None) -> None:
        """Record what :meth:`job_status` found: the platform ended job ``name`` apart from its trial
        (``why``, in its words: a pod evicted, a run crashed, a job paused) or, for None, did not."""
        _note(self._ended_by, name, why)

    def note_restart(self, name: str, why: str | None) -> None:
        """Record what :meth:`job_status` found: the platform runs job ``name`` again in place
        (``why``, in its words) or, for None, does not."""
        _note(self._restarts, name, why)

    def job_restarting(self, name: str, state: dict[str, Any]) -> bool:
        """Whether the platform runs job ``name``'s replicas again in place (:meth:`note_restart`,
        as the last :meth:`job_status` found it) or the trial's run ended (``state``, its keeper's
        record) by a stop signal trialflow did not send while the job goes on: either may be an
        interruption."""
        return name in self._restarts or bool(state.get("stop_signal"))

    def sole_primary(self) -> bool:
        """Whether the job runs one replica of its primary role, so that a primary replica that finds
        the trial claimed is that replica run again (on any host) and runs nothing (default: False,
        the claim's pod name tells)."""
        return False

    def job_logs(self, name: str) -> dict[str, bytes]:
        """The job's output by replica (whole logs); the ``logs`` metric channel and the HTTP channel's
        gap filler read it. Default: none (the trial's files on the share are read instead)."""
        return {}

    def check_platform(self) -> None:
        """Connect and check credentials once (fail fast with a hint). Default: nothing to check."""
        return None

    def platform_address(self) -> str:
        """The URL of the platform's API server (where its jobs run, for the receiver check)."""
        return ""

    def prepare_platform(self) -> None:
        """Platform objects made once per experiment (registry and storage secrets). Default: none."""
        return None


def _note(table: dict[str, str], name: str, why: str | None) -> None:
    """``table[name] = why``, or no entry for None."""
    if why is None:
        table.pop(name, None)
    else:
        table[name] = why
