"""Platform errors. Which ones are retried is decided here, once: a
:class:`TransientPlatformError` (5xx, timeout, dropped connection) is retried by the Prefect tasks
with backoff; any other :class:`PlatformError` is permanent (bad credentials, a refused request, an
over-limit code directory) and fails the trial -- or the experiment, at ``prepare`` -- at once."""

from __future__ import annotations


class PlatformError(RuntimeError):
    """A permanent platform error: the trial (or the experiment, at prepare) fails with this message."""


class TransientPlatformError(PlatformError):
    """A temporary platform error (5xx, timeout, dropped connection): the call is retried."""


class LostHandleError(PlatformError):
    """The platform no longer knows the trial a handle points to."""


def is_transient(exc: BaseException) -> bool:
    """True for errors worth retrying: transient platform errors only, never a config error, an
    over-limit upload or refused credentials."""
    return isinstance(exc, TransientPlatformError)
