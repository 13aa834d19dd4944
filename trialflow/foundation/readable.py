"""Waiting until one of some descriptors is readable, for any descriptor number, and :class:`Wakeup`, a
descriptor one thread (or a signal handler) makes readable to wake another.

``select.select`` refuses descriptors numbered past ``FD_SETSIZE`` (1024), which a controller following
hundreds of trials (each with a pidfd and a wake-up pipe) or one run under a raised ``ulimit -n`` reaches:
it raises ``ValueError``, and a caller that reads that as "closed" returns at once and spins. ``poll()``
has no such limit."""

from __future__ import annotations

import os
import select
from collections.abc import Iterable


def wait_readable(fds: Iterable[int], timeout: float | None) -> list[int]:
    """Block until one of ``fds`` is readable, closed (it then reads as ready) or ``timeout`` seconds
    passed (``None``: no limit); the descriptors that were ready (none: the time passed, or the wait was
    interrupted). Raises nothing."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    try:
        return [fd for fd, _ in poller.poll(None if timeout is None else max(timeout, 0.0) * 1000)]
    except OSError:
        return []


class Wakeup:
    """A pipe whose read end (``fd``) is readable once :meth:`set` was called since the last :meth:`clear`:
    a thread may wait on it together with other descriptors (a follower: its local trial's pidfd).
    :meth:`set` is one ``write``, safe in a signal handler and from any thread. Lifecycle: open from
    construction to :meth:`close`; whoever closes it makes sure no thread sets it after (a descriptor
    number is reused)."""

    def __init__(self) -> None:
        self.fd, self._write_fd = os.pipe()
        os.set_blocking(self.fd, False)
        os.set_blocking(self._write_fd, False)

    def set(self) -> None:
        try:
            os.write(self._write_fd, b"x")
        except (BlockingIOError, OSError):  # already set (the pipe is full), or closed
            pass

    def clear(self) -> None:
        try:
            while os.read(self.fd, 4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def wait(self, timeout: float) -> None:
        wait_readable([self.fd], timeout)  # closed meanwhile: it reads as ready

    def close(self) -> None:
        for fd in (self.fd, self._write_fd):
            try:
                os.close(fd)
            except OSError:
                pass
