"""``trialflow experiment report ID -o report.html``: one self-contained HTML file with the charts
NNI's WebUI showed, readable offline (plotly.js is inlined; nothing is fetched when it opens).

Charts (Optuna's plotly visualizations over the experiment's study, see :mod:`.optuna_mirror`, and
plotly directly where every trial must show, early-stopped ones too, as NNI's WebUI showed them):
- metric over trials by how each ended (an early-stopped trial at its last intermediate result), with
  the best-so-far line of the succeeded ones;
- intermediate results per trial (``plot_intermediate_values``);
- hyper-parameters as parallel coordinates, every trial with a value and how it ended;
- parameter importance (``plot_param_importances`` with PED-ANOVA, which needs no scikit-learn);
- duration per trial, coloured by how it ended;
- with several objectives: the Pareto front over the first two objectives (every succeeded trial,
  infeasible ones marked, the Pareto set joined by a line) and the hypervolume of the Pareto set
  after each trial, against the worst feasible value of each objective.

A chart without the data it needs (no intermediate results, too few finished trials for importance)
is replaced by one sentence saying so; the others are still written. Needs the ``plots`` extra.
"""

from __future__ import annotations

import html
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import optuna

from ..experiments.results import maximizes, multi_objective, multi_results, pareto_set, succeeded, trial_value
from ..foundation.status import TrialStatus
from ..records.store import ExperimentStore, TrialRecord
from ..tuners import scalar_or_none
from ..tuners.objectives import MultiResult, Objectives, hypervolume
from .dashboard import open_mirror, plots_module

MIN_FOR_IMPORTANCE = 4

_Item = TypeVar("_Item")
_STATUS_COLOURS: dict[str, str] = {
    TrialStatus.SUCCEEDED: "#2e7d32", TrialStatus.EARLY_STOPPED: "#f9a825", TrialStatus.FAILED: "#c62828",
    TrialStatus.USER_CANCELED: "#757575", TrialStatus.SYS_CANCELED: "#757575", TrialStatus.RUNNING: "#1565c0",
    TrialStatus.WAITING: "#90caf9"}


def _by_status(items: list[_Item], trial_of: Callable[[_Item], TrialRecord]) -> Iterator[tuple[str, str, list[_Item]]]:
    """The items grouped by their trial's status, in the charts' order, each with its status's colour;
    statuses without items are left out."""
    for status, colour in _STATUS_COLOURS.items():
        chosen = [item for item in items if trial_of(item).status == status]
        if chosen:
            yield status, colour, chosen


def _durations(started: list[TrialRecord]) -> Any:
    go = plots_module("plotly.graph_objects")
    now = time.time()
    figure = go.Figure()
    for status, colour, chosen in _by_status(started, lambda t: t):
        seconds = [(t.end_time or now) - (t.start_time or now) for t in chosen]
        figure.add_bar(x=[t.sequence for t in chosen], y=seconds, name=status, marker_color=colour,
                       text=[t.id for t in chosen], hovertemplate="trial %{text} (#%{x}): %{y:.1f} s")
    figure.update_layout(title="Duration per trial", xaxis_title="trial sequence", yaxis_title="seconds",
                         barmode="overlay")
    return figure


def _shown_values(store: ExperimentStore, records: list[TrialRecord]) -> list[tuple[TrialRecord, float]]:
    """Each trial with the value the charts give it: its final result, or an early-stopped trial's last
    intermediate one (NNI's WebUI showed those trials so)."""
    last: dict[str, float | None] = {}
    for metric in store.metrics(type="PERIODICAL"):
        last[metric.trial_id] = scalar_or_none(metric.value)
    shown = []
    for trial in records:
        value = trial_value(trial)
        if value is None and trial.status == TrialStatus.EARLY_STOPPED:
            value = last.get(trial.id)
        if value is not None:
            shown.append((trial, value))
    return shown


def _history(shown: list[tuple[TrialRecord, float]], maximize: bool) -> Any:
    go = plots_module("plotly.graph_objects")
    figure = go.Figure()
    for status, colour, chosen in _by_status(shown, lambda item: item[0]):
        name = f"{status} (last intermediate result)" if status == TrialStatus.EARLY_STOPPED else status
        figure.add_scatter(x=[t.sequence for t, _ in chosen], y=[v for _, v in chosen], mode="markers",
                           name=name, marker_color=colour, text=[t.id for t, _ in chosen],
                           hovertemplate="trial %{text} (#%{x}): %{y}")
    succeeded = sorted((t.sequence, v) for t, v in shown if t.status == TrialStatus.SUCCEEDED)
    best: list[float] = []
    for _, value in succeeded:
        best.append(value if not best else (max if maximize else min)(best[-1], value))
    if succeeded:
        figure.add_scatter(x=[s for s, _ in succeeded], y=best, mode="lines", name="Best Value",
                           line_color="#000000")
    figure.update_layout(xaxis_title="trial sequence", yaxis_title="metric")
    return figure


def _scored(records: list[TrialRecord], objectives: Objectives) -> list[tuple[TrialRecord, MultiResult]]:
    """The succeeded trials with usable results, in sequence order."""
    by_id = {t.id: t for t in records}
    return sorted(((by_id[i], r) for i, r in multi_results(succeeded(records), objectives).items()),
                  key=lambda pair: pair[0].sequence)


def _pareto_front(records: list[TrialRecord], objectives: Objectives) -> Any:
    go = plots_module("plotly.graph_objects")
    scored = _scored(records, objectives)
    front = {t.id for t in pareto_set(records, objectives)}
    x_name, y_name = objectives.names[0], objectives.names[1] if len(objectives.names) > 1 else objectives.names[0]
    figure = go.Figure()
    groups = [("dominated", "#90a4ae", "circle", [(t, r) for t, r in scored if r.feasible and t.id not in front]),
              ("infeasible (breaks a constraint)", "#c62828", "x", [(t, r) for t, r in scored if not r.feasible])]
    for name, colour, symbol, chosen in groups:
        if chosen:
            figure.add_scatter(x=[r.values[0] for _, r in chosen], y=[r.values[-1] for _, r in chosen],
                               mode="markers", name=name, marker={"color": colour, "symbol": symbol},
                               text=[t.id for t, _ in chosen], hovertemplate="trial %{text}: %{x}, %{y}")
    best = sorted(((t, r) for t, r in scored if t.id in front), key=lambda pair: pair[1].values[0])
    figure.add_scatter(x=[r.values[0] for _, r in best], y=[r.values[-1] for _, r in best], mode="lines+markers",
                       name="Pareto set", marker={"color": "#2e7d32", "size": 10}, line={"color": "#2e7d32"},
                       text=[t.id for t, _ in best], hovertemplate="trial %{text}: %{x}, %{y}")
    figure.update_layout(xaxis_title=f"{x_name} ({'max' if objectives.objectives[0].maximize else 'min'})",
                         yaxis_title=f"{y_name} ({'max' if objectives.objectives[-1].maximize else 'min'})")
    return figure


def _hypervolume_history(records: list[TrialRecord], objectives: Objectives) -> Any:
    go = plots_module("plotly.graph_objects")
    feasible = [(t, r) for t, r in _scored(records, objectives) if r.feasible]
    worst = [(min if o.maximize else max)(r.values[i] for _, r in feasible)
             for i, o in enumerate(objectives.objectives)]
    # a reference just beyond the worst feasible value, so that no Pareto point adds zero volume
    span = [(max(r.values[i] for _, r in feasible) - min(r.values[i] for _, r in feasible)) or 1.0
            for i in range(len(worst))]
    reference = [w - 0.1 * s if o.maximize else w + 0.1 * s
                 for w, s, o in zip(worst, span, objectives.objectives, strict=True)]
    sequences, volumes = [], []
    for i, (trial, _) in enumerate(feasible):
        sequences.append(trial.sequence)
        volumes.append(hypervolume(objectives, [r.values for _, r in feasible[:i + 1]], reference))
    figure = go.Figure(go.Scatter(x=sequences, y=volumes, mode="lines+markers", line_shape="hv",
                                  name="hypervolume"))
    figure.update_layout(xaxis_title="trial sequence", yaxis_title="hypervolume of the Pareto set")
    return figure


def _flat(parameters: Any, prefix: str = "") -> dict[str, Any]:
    """Nested parameters (a choice of dicts) as ``outer.inner`` keys."""
    if not isinstance(parameters, dict):
        return {prefix or "value": parameters}
    out: dict[str, Any] = {}
    for key, value in parameters.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        out.update(_flat(value, name) if isinstance(value, dict) else {name: value})
    return out


def _parallel(shown: list[tuple[TrialRecord, float]]) -> Any:
    go = plots_module("plotly.graph_objects")
    rows = [_flat(t.parameters) for t, _ in shown]
    names = sorted({k for row in rows for k in row})
    dimensions = [{"label": "metric", "values": [v for _, v in shown]}]
    for name in names:
        column = [row.get(name) for row in rows]
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in column):
            dimensions.append({"label": name, "values": column})
        else:  # categories (and trials without the parameter) as positions with their names
            labels = sorted({str(v) for v in column})
            dimensions.append({"label": name, "values": [labels.index(str(v)) for v in column],
                               "tickvals": list(range(len(labels))), "ticktext": labels})
    statuses = sorted({t.status for t, _ in shown})
    dimensions.append({"label": "status", "values": [statuses.index(t.status) for t, _ in shown],
                       "tickvals": list(range(len(statuses))), "ticktext": statuses})
    return go.Figure(go.Parcoords(line={"color": [v for _, v in shown], "colorscale": "Viridis",
                                        "showscale": True}, dimensions=dimensions))


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
    shown = _shown_values(store, records)
    no_value = "no trial has finished with a value yet" if not shown else None
    maximize = maximizes(store.experiment())
    makers: list[tuple[str, str | None, Callable[[], Any]]] = [
        ("Metric over trials (best so far as a line)", no_value, lambda: _history(shown, maximize)),
        ("Intermediate results", None if any(t.intermediate_values for t in trials)
         else "no trial reported intermediate results", lambda: vis.plot_intermediate_values(study)),
        ("Hyper-parameters (parallel coordinates)", no_value, lambda: _parallel(shown)),
        ("Parameter importance", None if complete >= MIN_FOR_IMPORTANCE
         else f"needs at least {MIN_FOR_IMPORTANCE} trials finished with a value ({complete} so far)",
         lambda: vis.plot_param_importances(study, evaluator=PedAnovaImportanceEvaluator())),
        ("Duration per trial", None if started else "no trial has started yet", lambda: _durations(started)),
    ]
    objectives = multi_objective(store.experiment())
    if objectives is not None:
        scored = _scored(records, objectives)
        none_feasible = None if any(r.feasible for _, r in scored) else "no trial has succeeded with a feasible result"
        makers[:0] = [
            ("Pareto front", None if scored else "no trial has succeeded with the objectives' values",
             lambda: _pareto_front(records, objectives)),
            ("Hypervolume over trials", none_feasible, lambda: _hypervolume_history(records, objectives))]
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
