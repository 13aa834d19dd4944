"""Trial and experiment statuses: the one vocabulary of the store, the flows, the CLI, the reports and
the platforms (bottom layer; no imports of the project's own).

Both are ``str`` enums, so a value read back from the store compares equal to its member and is
written as its name. Trial statuses are NNI's; an experiment is INITIALIZED when created, RUNNING
while a controller drives it, and ends DONE, STOPPED or ERROR (a resumed one runs again).
"""

from __future__ import annotations

from enum import Enum


class _Named(str, Enum):
    """A status whose text is its name (``str()`` and f-strings give ``FAILED``, not the class path)."""

    def __str__(self) -> str:
        return self.value


class TrialStatus(_Named):
    WAITING = "WAITING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    USER_CANCELED = "USER_CANCELED"
    SYS_CANCELED = "SYS_CANCELED"
    EARLY_STOPPED = "EARLY_STOPPED"

    @property
    def is_terminal(self) -> bool:
        return self not in (TrialStatus.WAITING, TrialStatus.RUNNING)


TERMINAL = frozenset(s for s in TrialStatus if s.is_terminal)
LIVE = (TrialStatus.WAITING, TrialStatus.RUNNING)
STOPPED_BY_US = (TrialStatus.USER_CANCELED, TrialStatus.EARLY_STOPPED)  # recorded before the kill they cause
ASSESSOR_STOP = "stopped early by the assessor"  # the message of an EARLY_STOPPED trial, by its cause
DURATION_STOP = "stopped at maxTrialDuration"


class ExperimentStatus(_Named):
    INITIALIZED = "INITIALIZED"
    RUNNING = "RUNNING"
    DONE = "DONE"
    STOPPED = "STOPPED"
    ERROR = "ERROR"


EXPERIMENT_LIVE = (ExperimentStatus.RUNNING, ExperimentStatus.INITIALIZED)  # a controller drives it, or is about to
EXPERIMENT_ENDED = (ExperimentStatus.DONE, ExperimentStatus.STOPPED, ExperimentStatus.ERROR)
