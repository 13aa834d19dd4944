"""Prefect UI artifacts of a running experiment: progress, trial table, best trial (with the metric's
direction and how many trials finished, stopped early or failed) and, while ``trialflow dashboard``
serves one, a link to its live optuna-dashboard.

Updated at most every ``MIN_INTERVAL`` seconds (artifact writes are API calls; large experiments
update less often, see :meth:`ArtifactReporter.update`) and once at the end.
Metric values are made JSON-safe first (the API would emit ``Infinity``).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from .context import ExperimentContext
from .platforms import service_name
from .results import best_trial, maximizes, outcome_counts, trial_value
from .store import TrialRecord

DASHBOARD_URL_CONTROL = "dashboard_url"  # set by trialflow.dashboard while one serves
MIN_INTERVAL = 3.0
MAX_SHARE = 20
MAX_TABLE_ROWS = 500
log = logging.getLogger("trialflow.ui")


def flow_run_page(api: str | None, flow_run_id: str | None) -> str | None:
    """The Prefect UI page of a flow run on the configured API ``api`` (None for Prefect's temporary
    server, which serves no UI)."""
    if not api or not flow_run_id:
        return None
    from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api}):
        ui = PREFECT_UI_URL.value()
    return f"{ui.rstrip('/')}/runs/flow-run/{flow_run_id}" if ui else None


def trial_counts(trials: list[TrialRecord], maximize: bool) -> str:
    """One line: the metric's direction and how many trials finished, stopped early or failed."""
    counts = outcome_counts(trials)
    failed = sum(counts.get(s, 0) for s in ("FAILED", "USER_CANCELED", "SYS_CANCELED"))
    return (f"metric direction: **{'maximize' if maximize else 'minimize'}** · finished: "
            f"{counts.get('SUCCEEDED', 0)} · early-stopped: {counts.get('EARLY_STOPPED', 0)} · "
            f"failed or canceled: {failed}")


def _safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _safe(v) for k, v in value.items()}
    return value


class ArtifactReporter:
    def __init__(self, ctx: ExperimentContext) -> None:
        self.ctx = ctx
        self.key = f"experiment-{ctx.experiment_id}"
        self._last = 0.0
        self._interval = MIN_INTERVAL
        self._progress_id: Any = None
        self._dashboard_url: str | None = None

    def maybe_update(self) -> None:
        if time.monotonic() - self._last >= self._interval:
            self.update()

    def update(self) -> None:
        self._last = time.monotonic()
        try:
            self._publish()
        except Exception as exc:  # the UI must never stop an experiment
            log.warning("could not update the Prefect UI artifacts: %s", exc)
        # Publishing reads every trial: with thousands of them it takes longer, so it runs less often
        # and never takes more than ~1/MAX_SHARE of the controller's time.
        self._interval = max(MIN_INTERVAL, (time.monotonic() - self._last) * MAX_SHARE)

    def _publish(self) -> None:
        from prefect.artifacts import (
            create_link_artifact,
            create_markdown_artifact,
            create_progress_artifact,
            create_table_artifact,
            update_progress_artifact,
        )

        trials = self.ctx.store.trials()
        budget = self.ctx.config.max_trial_number
        done = sum(t.is_terminal for t in trials)
        progress = 100.0 * done / budget if budget else (100.0 if done and done == len(trials) else 0.0)
        if self._progress_id is None:
            self._progress_id = create_progress_artifact(progress=progress, key=f"{self.key}-progress",
                                                         description="trials finished / maxTrialNumber")
        else:
            update_progress_artifact(artifact_id=self._progress_id, progress=progress)
        hybrid = self.ctx.config.is_hybrid
        rows = [{"trial": t.id, "sequence": t.sequence, "status": t.status,
                 **({"service": service_name(t.handle) or ""} if hybrid else {}), "metric": _safe(trial_value(t)),
                 **{f"param.{k}": _safe(v) for k, v in t.parameters.items()}} for t in trials[-MAX_TABLE_ROWS:]]
        create_table_artifact(key=f"{self.key}-trials", table=rows, description="trials (latest 500)")
        maximize = maximizes(self.ctx.store.experiment())
        best = best_trial(trials, maximize)
        text = "No successful trial yet." if best is None else (
            f"# Best trial `{best.id}` (#{best.sequence})\n\nmetric: **{trial_value(best)}**\n\n"
            + "\n".join(f"- `{k}` = `{v}`" for k, v in best.parameters.items()))
        text += f"\n\n{trial_counts(trials, maximize)}"
        create_markdown_artifact(key=f"{self.key}-best", markdown=text, description="best trial so far")
        url = self.ctx.store.controls().get(DASHBOARD_URL_CONTROL)
        if url and url != self._dashboard_url:
            create_link_artifact(key=f"{self.key}-dashboard", link=url, link_text="live optuna-dashboard",
                                 description="charts of this experiment, updated as trials report")
            self._dashboard_url = url
