"""``trialflow experiment report ID -o report.html``: one self-contained HTML file with the charts
NNI's WebUI showed, readable offline (plotly.js is inlined; nothing is fetched when it opens).

Charts (Optuna's plotly visualizations over the experiment's study, see :mod:`.optuna_mirror`):
- metric over trials, with the best-so-far line (``plot_optimization_history``);
- intermediate results per trial (``plot_intermediate_values``);
- hyper-parameters as parallel coordinates (``plot_parallel_coordinate``);
- parameter importance (``plot_param_importances`` with PED-ANOVA, which needs no scikit-learn);
- duration per trial, coloured by how it ended (plotly directly).

A chart without the data it needs (no intermediate results, too few finished trials for importance)
is replaced by one sentence saying so; the others are still written. Needs the ``plots`` extra.
"""

from __future__ import annotations

import html
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna

from ..status import TrialStatus
from ..store import ExperimentStore, TrialRecord
from .dashboard import open_mirror, plots_module

MIN_FOR_IMPORTANCE = 4

_STATUS_COLOURS: dict[str, str] = {
    TrialStatus.SUCCEEDED: "#2e7d32", TrialStatus.EARLY_STOPPED: "#f9a825", TrialStatus.FAILED: "#c62828",
    TrialStatus.USER_CANCELED: "#757575", TrialStatus.SYS_CANCELED: "#757575", TrialStatus.RUNNING: "#1565c0",
    TrialStatus.WAITING: "#90caf9"}


def _durations(started: list[TrialRecord]) -> Any:
    go = plots_module("plotly.graph_objects")
    now = time.time()
    figure = go.Figure()
    for status, colour in _STATUS_COLOURS.items():
        chosen = [t for t in started if t.status == status]
        if chosen:
            seconds = [(t.end_time or now) - (t.start_time or now) for t in chosen]
            figure.add_bar(x=[t.sequence for t in chosen], y=seconds,
                           name=status, marker_color=colour, text=[t.id for t in chosen],
                           hovertemplate="trial %{text} (#%{x}): %{y:.1f} s")
    figure.update_layout(title="Duration per trial", xaxis_title="trial sequence", yaxis_title="seconds",
                         barmode="overlay")
    return figure


def charts(store: ExperimentStore, records: list[TrialRecord]) -> list[tuple[str, Any]]:
    """(title, plotly figure or the reason it is missing) for each chart of the report; ``records``
    are the store's trials."""
    plots_module("plotly")
    from optuna import visualization as vis
    from optuna.importance import PedAnovaImportanceEvaluator

    mirror = open_mirror(store, optuna.storages.InMemoryStorage())
    mirror.sync()
    study = optuna.load_study(study_name=mirror.study_name, storage=mirror.storage)
    trials = study.get_trials(deepcopy=False)
    started = [t for t in records if t.start_time]
    complete = sum(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    no_value = "no trial has finished with a value yet" if not complete else None
    makers: list[tuple[str, str | None, Callable[[], Any]]] = [
        ("Metric over trials (best so far as a line)", no_value, lambda: vis.plot_optimization_history(study)),
        ("Intermediate results", None if any(t.intermediate_values for t in trials)
         else "no trial reported intermediate results", lambda: vis.plot_intermediate_values(study)),
        ("Hyper-parameters (parallel coordinates)", no_value, lambda: vis.plot_parallel_coordinate(study)),
        ("Parameter importance", None if complete >= MIN_FOR_IMPORTANCE
         else f"needs at least {MIN_FOR_IMPORTANCE} trials finished with a value ({complete} so far)",
         lambda: vis.plot_param_importances(study, evaluator=PedAnovaImportanceEvaluator())),
        ("Duration per trial", None if started else "no trial has started yet", lambda: _durations(started)),
    ]
    out: list[tuple[str, Any]] = []
    for title, missing, make in makers:
        if missing is not None:
            out.append((title, f"not available: {missing}"))
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Optuna's notes on small studies; the chart says enough
                out.append((title, make()))
        except (ValueError, RuntimeError, ZeroDivisionError) as exc:  # data this chart cannot use
            out.append((title, f"not available: {exc}"))
    return out


def write_report(store: ExperimentStore, path: Path) -> dict[str, str | None]:
    """Write the report; returns each chart's title with None when drawn, else why it is missing."""
    offline = plots_module("plotly.offline")
    record = store.experiment()
    sections = []
    drawn: dict[str, str | None] = {}
    records = store.trials()
    for title, figure in charts(store, records):
        drawn[title] = figure if isinstance(figure, str) else None
        if isinstance(figure, str):
            body = f"<p class='missing'>{html.escape(figure)}</p>"
        else:
            figure.update_layout(title=title)
            body = figure.to_html(full_html=False, include_plotlyjs=False)
        sections.append(f"<section><h2>{html.escape(title)}</h2>{body}</section>")
    name = html.escape(f"{record.name or 'experiment'} {record.id}")
    counts: dict[str, int] = {}
    for trial in records:
        counts[trial.status] = counts.get(trial.status, 0) + 1
    summary = ", ".join(f"{status} {n}" for status, n in sorted(counts.items())) or "no trials"
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{name}</title>"
            "<style>body{font-family:sans-serif;margin:2em}.missing{color:#757575}</style>"
            f"<script type='text/javascript'>{offline.get_plotlyjs()}</script></head><body>"
            f"<h1>{name}</h1><p>status {html.escape(record.status)}; trials: {html.escape(summary)}</p>"
            + "".join(sections) + "</body></html>")
    path.write_text(page, encoding="utf-8")
    return drawn
