"""Platform errors. Which ones are retried is decided here, once: a
:class:`TransientPlatformError` (5xx, timeout, dropped connection) is retried by the Prefect tasks
with backoff; any other :class:`PlatformError` is permanent (bad credentials, a refused request, an
over-limit code directory) and fails the trial -- or the experiment, at ``prepare`` -- at once."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ..foundation.user_errors import UserError

T = TypeVar("T")


class PlatformError(UserError, RuntimeError):
    """A permanent platform error: the trial (or the experiment, at prepare) fails with this message."""


class TransientPlatformError(PlatformError):
    """A temporary platform error (5xx, timeout, dropped connection): the call is retried."""


class LostHandleError(PlatformError):
    """The platform no longer knows the trial a handle points to."""


def http_error(status: int | None, message: str, refused: str | None = None) -> PlatformError:
    """The one classification of an HTTP or SDK failure, for every platform: no answer (``status``
    None or 0), throttling (429) and server errors (5xx) are transient; 401 and 403 are a credentials
    error, with the ``refused`` message when the caller gives one (naming what to check); anything
    else is permanent. Returns the error for the caller to raise."""
    if not status or status == 429 or status >= 500:
        return TransientPlatformError(message)
    if status in (401, 403) and refused is not None:
        return PlatformError(refused)
    return PlatformError(message)


def is_transient(exc: BaseException) -> bool:
    """True for errors worth retrying: transient platform errors only, never a config error, an
    over-limit upload or refused credentials."""
    return isinstance(exc, TransientPlatformError)


@dataclass(frozen=True)
class RetryPolicy:
    """How the Prefect tasks retry a platform call that failed with a transient error: ``retries``
    more attempts, ``delay`` seconds before the first, doubling each time (exponential backoff)."""

    retries: int = 4
    delay: float = 1.0

    def delays(self) -> list[float]:
        return [self.delay * 2**i for i in range(self.retries)]

    def call(self, fn: Callable[[], T], on_retry: Callable[[TransientPlatformError, float], None] | None = None) -> T:
        """``fn()``, retried on transient platform errors with these delays -- for the calls made
        outside a Prefect task (``prepare``); tasks get the same policy as Prefect retries."""
        for delay in self.delays():
            try:
                return fn()
            except TransientPlatformError as exc:
                if on_retry is not None:
                    on_retry(exc, delay)
                time.sleep(delay)
        return fn()
