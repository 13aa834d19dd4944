"""Waiting until one of some descriptors is readable, for any descriptor number.

``select.select`` refuses descriptors numbered past ``FD_SETSIZE`` (1024), which a controller following
hundreds of trials (each with a pidfd and a wake-up pipe) or one run under a raised ``ulimit -n`` reaches:
it raises ``ValueError``, and a caller that reads that as "closed" returns at once and spins. ``poll()``
has no such limit."""

from __future__ import annotations

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
