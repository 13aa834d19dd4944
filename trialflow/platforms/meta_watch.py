"""Wake-ups for changes in followed local trials' ``.nni`` folders, from Linux's inotify.

A local trial's results (``metrics``), its start (``started``) and its end (``state``) are files its
runtime and keeper write in ``<trial dir>/.nni``. A follower that waits on its trial's wake-up here is
woken when any of them changes, so a quiet trial's follower can sleep long between polls and still see
a result at once.

Lifecycle: one :class:`MetaWatch` per local service, made at the first :meth:`MetaWatch.watch`; one
inotify instance (users have few of those: 128 by default) and one daemon thread that reads its events
and sets the wake-up of the folder they came from; :meth:`MetaWatch.close` stops the thread and closes
every wake-up. Thread-safe. An event only wakes a follower, which then reads the trial's files as any
poll does: nothing an event carries is trusted.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from ..foundation.readable import Wakeup, wait_readable

log = logging.getLogger("trialflow.local")

# what a trial's runtime and keeper do in its .nni folder (append, create, rename into place), and the
# folder's own removal
_CHANGES = ("MODIFY", "CREATE", "MOVED_TO", "CLOSE_WRITE", "DELETE_SELF", "MOVE_SELF")
# after an event, how long the thread waits for more before it wakes followers: a trial that reports in
# bursts wakes its follower once per burst
_COALESCE_MS = 20


class MetaWatch:
    """See the module."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inotify: Any = None  # made with the thread, at the first watch; False: inotify is not available
        self._mask = 0
        self._by_folder: dict[str, tuple[int, Wakeup]] = {}
        self._by_wd: dict[int, Wakeup] = {}
        self._stop = Wakeup()
        self._thread: threading.Thread | None = None
        self._closed = False

    def watch(self, folder: str) -> tuple[int, bool] | None:
        """The descriptor that is readable once ``folder`` changed since :meth:`clear` (watched from
        now on), and whether this call began the watch; None where it cannot be watched (no inotify here,
        the user's inotify instances or watches used up, the folder not there yet): the caller polls then.
        Raises nothing."""
        with self._lock:
            if self._closed:
                return None
            known = self._by_folder.get(folder)
            if known is not None:
                return known[1].fd, False
            inotify = self._started()
            if inotify is None:
                return None
            try:
                wd = inotify.add_watch(folder, self._mask)
            except OSError as exc:  # gone, or fs.inotify.max_user_watches reached
                log.debug("not watching %s: %s", folder, exc)
                return None
            wakeup = self._by_wd.get(wd) or Wakeup()  # the same folder under another name: one watch
            self._by_folder[folder] = (wd, wakeup)
            self._by_wd[wd] = wakeup
            return wakeup.fd, True

    def clear(self, folder: str) -> None:
        """Before reading ``folder``: a change from now on makes its descriptor readable again."""
        with self._lock:  # not while forget() closes it: its descriptor number may be reused
            known = self._by_folder.get(folder)
            if known is not None:
                known[1].clear()

    def forget(self, folder: str) -> None:
        """Stop watching ``folder`` (its trial ended; nothing where it was not watched); its descriptor is
        closed."""
        with self._lock:
            known = self._by_folder.pop(folder, None)
            if known is None:
                return
            wd, wakeup = known
            if any(w == wd for w, _ in self._by_folder.values()):
                return
            self._by_wd.pop(wd, None)
            if self._inotify:
                try:
                    self._inotify.rm_watch(wd)
                except OSError:  # the folder went first: the kernel dropped the watch
                    pass
            wakeup.close()  # under the lock: the thread never writes to a descriptor number reused since

    def close(self) -> None:
        """Stop the thread and close every wake-up; later watches return None."""
        with self._lock:
            self._closed = True
            thread = self._thread
        self._stop.set()
        if thread is not None:
            thread.join()
        with self._lock:
            for wakeup in self._by_wd.values():
                wakeup.close()
            self._by_folder.clear()
            self._by_wd.clear()
            if self._inotify:
                self._inotify.close()
            self._inotify = False
        self._stop.close()

    def _started(self) -> Any:
        """The inotify instance, made with its thread on first use (under the lock); None without one."""
        if self._inotify is None:
            try:
                from inotify_simple import INotify, flags
                self._inotify = INotify()
            except (ImportError, OSError) as exc:  # not Linux, or fs.inotify.max_user_instances reached
                log.debug("no inotify: a quiet local trial is polled every second (%s)", exc)
                self._inotify = False
                return None
            for name in _CHANGES:
                self._mask |= getattr(flags, name)
            self._thread = threading.Thread(target=self._dispatch, name="trialflow-meta-watch", daemon=True)
            self._thread.start()
        return self._inotify or None

    def _dispatch(self) -> None:
        inotify = self._inotify
        assert inotify
        while True:
            wait_readable([inotify.fileno(), self._stop.fd], None)
            if self._closed or wait_readable([self._stop.fd], _COALESCE_MS / 1000):  # a burst's later events
                return
            try:
                events = list(inotify.read(timeout=0))
            except OSError:
                return
            with self._lock:  # set under the lock: forget() closes under it
                if any(e.wd == -1 for e in events):  # the queue overflowed: any folder may have changed
                    woken = set(self._by_wd.values())
                else:
                    woken = {w for e in events if (w := self._by_wd.get(e.wd)) is not None}
                for wakeup in woken:
                    wakeup.set()
