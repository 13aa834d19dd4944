"""A full disk under a running experiment: told apart from every other failure, so that the controller
stops without cancelling its trials (``trialflow resume`` re-attaches them once space is freed) and says
so in one line, and so that its log file drops what it cannot write instead of printing a traceback for
every record.

Standard library only (and the trial runtime's own list of no-space errors); used by the flow, its
tasks and the CLI.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil

from ..foundation.user_errors import UserError
from ..trial.procs import NO_SPACE_ERRNOS

SQLITE_FULL = "database or disk is full"  # sqlite3.OperationalError's text for SQLITE_FULL
POSTGRES_DISK_FULL = "53100"  # SQLSTATE disk_full: the store's database server ran out of space
MIN_FREE_BYTES = 1 << 20  # below this, the next write of the store or of a trial's record may fail


def no_space(exc: BaseException) -> BaseException | None:
    """The innermost error in ``exc``'s chain (itself, its cause or context, as SQLAlchemy and Prefect
    wrap them) that says a disk is full or a quota spent; None when there is none."""
    seen: set[int] = set()
    found = None
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if (isinstance(current, OSError) and current.errno in NO_SPACE_ERRNOS
                or getattr(current, "sqlstate", None) == POSTGRES_DISK_FULL or SQLITE_FULL in str(current)):
            found = current
        current = current.__cause__ or current.__context__
    return found


def out_of_space(folder: str | os.PathLike[str]) -> OSError | None:
    """An ENOSPC error naming ``folder`` when its file system has less than :data:`MIN_FREE_BYTES` left
    for this user (nothing may have failed yet: a trial waiting to record its end writes nothing more);
    None otherwise, or when the folder cannot be looked at."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return None
    if free >= MIN_FREE_BYTES:
        return None
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(folder))


class NoSpaceLeft(UserError):
    """The experiment's controller stopped for want of disk space; its trials were left running.
    ``where``: the folder (or store) that could not be written."""

    def __init__(self, experiment_id: str, where: str) -> None:
        self.experiment_id = experiment_id
        super().__init__(f"no space left on the device of {where}: experiment {experiment_id} stopped, its running "
                         f"trials go on; free space, then `trialflow resume {experiment_id}`")

    @classmethod
    def from_error(cls, experiment_id: str, error: BaseException, folder: str) -> NoSpaceLeft:
        """The one line for ``error`` (a chain :func:`no_space` finds an error in): it names the folder of
        the file that could not be written, the store's database server, or else ``folder``."""
        full = no_space(error) or error
        if getattr(full, "sqlstate", None) == POSTGRES_DISK_FULL:
            return cls(experiment_id, "the experiment store's database server")
        filename = getattr(full, "filename", None)
        if not filename:
            return cls(experiment_id, folder)
        filename = os.fspath(filename)
        return cls(experiment_id, filename if os.path.isdir(filename) else os.path.dirname(filename))


class SpaceTolerantFileHandler(logging.FileHandler):
    """A log file that drops the records it cannot write for want of space (the terminal and Prefect's
    API still get them) instead of printing a traceback for each; other write errors are reported as
    :class:`logging.Handler` does. Closing it never raises for want of space either."""

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 -- logging's name
        import sys

        if no_space(sys.exc_info()[1] or Exception()) is None:
            super().handleError(record)

    def close(self) -> None:
        try:
            super().close()
        except OSError as exc:
            if no_space(exc) is None:
                raise
