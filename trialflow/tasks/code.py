"""The ``upload_code`` task: make the trial code directory available to the training service once
per experiment run (services make the upload idempotent by content)."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from ..context import ExperimentContext
from ..platforms import CodeRef


@task(name="upload_code", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2)
def upload_code(ctx: ExperimentContext, code_dir: Path) -> CodeRef:
    return ctx.service.upload_code(Path(code_dir))
