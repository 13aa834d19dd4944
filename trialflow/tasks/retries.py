"""Retry rules of the task library: Prefect retries transient platform errors only (a 5xx, a
timeout, a dropped connection), never a config error, an over-limit upload or refused credentials."""

from __future__ import annotations

from typing import Any

from ..platforms import RetryPolicy, is_transient


def retry_transient(task: Any, task_run: Any, state: Any) -> bool:
    """``retry_condition_fn`` of the platform tasks: True when the failure was transient."""
    try:
        state.result()
    except BaseException as exc:  # noqa: BLE001 -- the failed state re-raises what the task raised
        return is_transient(exc)
    return False


def retry_options(policy: RetryPolicy) -> dict[str, Any]:
    """``with_options`` arguments for a platform's retry policy (exponential backoff)."""
    return {"retries": policy.retries, "retry_delay_seconds": policy.delays(), "retry_condition_fn": retry_transient}
