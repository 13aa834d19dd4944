"""The ``upload_code`` task: make the trial code directory available to the experiment's training
service (once per experiment run; services make it idempotent by content). Transient platform
errors are retried with backoff; a permanent one (an over-limit code directory, refused
credentials) fails at once."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from ..experiments.context import get_context
from ..platforms import CodeRef, RetryPolicy
from .retries import retry_options


@task(name="upload_code", cache_policy=NO_CACHE, task_run_name="upload-{experiment_id}",
      **retry_options(RetryPolicy(retries=3)))
def upload_code(experiment_id: str, code_dir: str) -> CodeRef:
    """Upload ``code_dir`` for the experiment; the result is kept for its trials' submissions."""
    ctx = get_context(experiment_id)
    ctx.code = ctx.service.upload_code(Path(code_dir))
    return ctx.code
