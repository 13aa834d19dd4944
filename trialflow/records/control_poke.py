"""Telling a running controller that its experiment's controls changed, so it need not wait for its next look.

A process that writes a control to an embedded store (``trialflow stop``, ``trial kill``, ``update``,
the Python API) touches ``controls-changed`` beside the store's database (:func:`poke`); the
controller's experiment loop watches that file with Linux's inotify (:class:`ControlsWatch`) and reads
its controls when it changes. A shared database has no such file: its controller reads its controls at
its next look.

Lifecycle: the experiment loop makes a :class:`ControlsWatch` at its start (the file is created then,
0600, when missing) and closes it at its end; a poke where no controller made the file does nothing. A
poke carries nothing: the controller reads its controls from the store as at any look, so a touch made
by anyone only wakes it early.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import sqlalchemy as sa

log = logging.getLogger("trialflow.experiment")

POKE_FILE = "controls-changed"


def poke_path(url: str) -> Path | None:
    """The file a control written to the store of ``url`` touches; None for a shared database."""
    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    return Path(parsed.database).parent / POKE_FILE


def poke(url: str) -> None:
    """Wake the controller watching the store of ``url``, if one does (its file exists). Raises nothing."""
    path = poke_path(url)
    if path is not None:
        try:
            os.utime(path, follow_symlinks=False)
        except OSError:  # no controller made it, or it is not ours to touch: the controller looks anyway
            pass


class ControlsWatch:
    """A descriptor that is readable once the store's controls were poked since :meth:`clear`.

    ``fd`` is None where nothing can be watched (a shared database, no inotify, the user's inotify
    instances used up, the file a symlink): the loop then only looks at its controls on its own clock."""

    def __init__(self, url: str) -> None:
        self.fd: int | None = None
        self._inotify: Any = None
        path = poke_path(url)
        if path is None:
            return
        try:
            from inotify_simple import INotify, flags

            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
            self._inotify = INotify()
            self._inotify.add_watch(str(path), flags.ATTRIB | flags.CLOSE_WRITE | flags.DONT_FOLLOW)
        except (ImportError, OSError) as exc:
            log.debug("controls not watched, looked at on the loop's clock: %s", exc)
            self.close()
            return
        self.fd = self._inotify.fileno()

    def clear(self) -> None:
        """Before reading the controls: a poke from now on makes ``fd`` readable again."""
        if self._inotify is not None:
            self._inotify.read(timeout=0)

    def close(self) -> None:
        if self._inotify is not None:
            self._inotify.close()
        self._inotify, self.fd = None, None
