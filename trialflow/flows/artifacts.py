"""Prefect UI artifacts of a running experiment: progress, trial table, best trial (with the metric's
direction and how many trials finished, stopped early or failed) and, while ``trialflow dashboard``
serves one, a link to its live optuna-dashboard.

Written only when their content changed (see :class:`ArtifactReporter`): the progress in place, the
table and the summary at most every five minutes and once at the end.
Metric values are made JSON-safe first (the API would emit ``Infinity``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

from ..experiments.context import ExperimentContext
from ..experiments.results import best_trial, maximizes, outcome_counts, pareto_lines, trial_value
from ..foundation.status import TrialStatus
from ..platforms import service_name
from ..records.store import TERMINAL, Control, TrialRecord
from .api_outage import OptionalCalls, next_try_after

PROGRESS_INTERVAL = 3.0  # seconds between looks at the progress (updated in place when it moved)
SNAPSHOT_INTERVAL = 300.0  # seconds between new versions of the trials table and the summary
MAX_TABLE_ROWS = 500
log = logging.getLogger("trialflow.flows.artifacts")


def trial_counts(trials: list[TrialRecord], maximize: bool) -> str:
    """One line: the metric's direction and how many trials finished, stopped early or failed."""
    counts = outcome_counts(trials)
    failed = sum(counts.get(s, 0) for s in (TrialStatus.FAILED, TrialStatus.USER_CANCELED, TrialStatus.SYS_CANCELED))
    return (f"metric direction: **{'maximize' if maximize else 'minimize'}** · finished: "
            f"{counts.get('SUCCEEDED', 0)} · early-stopped: {counts.get('EARLY_STOPPED', 0)} · "
            f"failed or canceled: {failed}")


def json_safe(value: Any) -> Any:
    """``value`` with its non-finite floats (in dicts and lists too) as strings: the API would emit
    ``Infinity``, which is no JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


class ArtifactReporter:
    """The experiment's Prefect artifacts, written only when their content changed: the progress bar
    updated in place (one artifact, no new versions) at most every ``PROGRESS_INTERVAL`` seconds; new
    versions of the trials table and the best-trial summary at most every ``SNAPSHOT_INTERVAL`` seconds
    (the first as soon as a trial has ended) and once at the end. An 8-hour experiment so writes at most
    ~200 versions; the live dashboard is for watching second by second.

    Lifecycle: :meth:`maybe_update` on every loop tick, :meth:`update` with ``final=True`` once at the
    end. Never raises: a failed write is logged and tried again at the next turn."""

    def __init__(self, ctx: ExperimentContext) -> None:
        self.ctx = ctx
        self.key = f"experiment-{ctx.experiment_id}"
        self._next_progress = 0.0
        self._next_snapshot = 0.0
        self._calls = OptionalCalls("the Prefect UI artifacts", log)
        self._progress_id: Any = None
        self._progress: float | None = None
        self._written: dict[str, Any] = {}  # artifact key -> the content of its latest version
        self._dashboard_url: str | None = None
        self.versions = 0  # versions created by this reporter (progress updates in place do not count)

    def maybe_update(self) -> None:
        if time.monotonic() >= self._next_progress:
            self.update()

    def update(self, final: bool = False) -> None:
        started = time.monotonic()
        try:
            with self._calls.once(unless_answering=final):
                asked = self._publish(final or started >= self._next_snapshot, final)
        except Exception as exc:  # the UI must never stop an experiment
            self._calls.failed(exc)
        else:
            if asked:  # nothing to write says nothing of the API
                self._calls.answered()
        # A snapshot reads every trial: with thousands of them it takes longer, so the progress is
        # looked at less often after one (as after an API that did not answer at once).
        self._next_progress = next_try_after(PROGRESS_INTERVAL, started)

    def _publish(self, snapshot_due: bool, final: bool = False) -> bool:
        """Write what changed; True when that asked the API anything."""
        from prefect.artifacts import create_link_artifact, create_progress_artifact, update_progress_artifact

        counts = self.ctx.store.count_by_status()
        controls = self.ctx.store.controls()
        # `update trialnum` and `resume --trialnum` replace the config's budget
        budget = controls.get(Control.MAX_TRIAL_NUMBER, self.ctx.config.max_trial_number)
        done = sum(n for status, n in counts.items() if status in TERMINAL)
        total = sum(counts.values())
        progress = round(100.0 * done / budget if budget else (100.0 if done and done == total else 0.0), 1)
        asked = False
        if self._progress_id is None:
            asked = True
            self._progress_id = create_progress_artifact(progress=progress, key=f"{self.key}-progress",
                                                         description="trials finished / maxTrialNumber")
            self.versions += 1
        elif progress != self._progress:
            asked = True
            update_progress_artifact(artifact_id=self._progress_id, progress=progress)
        self._progress = progress
        if snapshot_due and done:
            asked = self._snapshot(self.ctx.store.trials(), final) or asked
            self._next_snapshot = time.monotonic() + SNAPSHOT_INTERVAL
        url = controls.get(Control.DASHBOARD_URL)
        if url and url != self._dashboard_url:
            asked = True
            create_link_artifact(key=f"{self.key}-dashboard", link=url, link_text="live optuna-dashboard",
                                 description="charts of this experiment, updated as trials report")
            self._dashboard_url = url
            self.versions += 1
        return asked

    def _snapshot(self, trials: list[TrialRecord], final: bool = False) -> bool:
        """New versions of the trials table and the best-trial summary, each only when it changed; the
        ``final`` one (the run's end) says that the best trial is the run's, not the best so far. True
        when either was written."""
        from prefect.artifacts import create_markdown_artifact, create_table_artifact

        hybrid = self.ctx.config.is_hybrid
        rows = [{"trial": t.id, "sequence": t.sequence, "status": t.status,
                 **({"service": service_name(t.handle) or ""} if hybrid else {}), "metric": json_safe(trial_value(t)),
                 **{f"param.{k}": json_safe(v) for k, v in t.parameters.items()}} for t in trials[-MAX_TABLE_ROWS:]]
        asked = self._write_if_changed("trials", rows, lambda: create_table_artifact(
            key=f"{self.key}-trials", table=rows, description="trials (latest 500)"))
        record = self.ctx.store.experiment()
        maximize = maximizes(record)
        best = best_trial(trials, maximize)
        front = pareto_lines(record, trials)
        if front is not None:  # several objectives: the Pareto set stands for the best trial
            text = f"# {front[0]}\n\n" + "\n".join(f"- {line.strip()}" for line in front[1:])
        elif best is None:
            text = "No successful trial yet."
        else:
            text = (f"# Best trial `{best.id}` (#{best.sequence})\n\nmetric: **{trial_value(best)}**\n\n"
                    + "\n".join(f"- `{k}` = `{v}`" for k, v in best.parameters.items()))
        text += f"\n\n{trial_counts(trials, maximize)}"
        if final:
            text += "\n\nThis run of the experiment has ended: no later trial comes into it."
        return self._write_if_changed("best", text, lambda: create_markdown_artifact(
            key=f"{self.key}-best", markdown=text,
            description="best trial of the run" if final else "best trial so far")) or asked

    def _write_if_changed(self, name: str, content: Any, write: Callable[[], object]) -> bool:
        """A new version of artifact ``name`` when ``content`` differs from its latest (then True); the
        content counts as written only once ``write`` returned (a failed write is tried again next time)."""
        if self._written.get(name) == content:
            return False
        write()
        self._written[name] = content
        self.versions += 1
        return True
