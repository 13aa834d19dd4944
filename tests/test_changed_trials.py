"""Views refreshed while an experiment runs read only what changed: the live table of a foreground run
shows the right counts, best trial and running trials after each refresh, at a cost that does not grow
with the trials already ended."""

from __future__ import annotations

import time

from rich.console import Console

from tests.conftest import base_config
from trialflow import parse_config
from trialflow.experiments import create_experiment, open_store
from trialflow.presentation.live import _LiveView
from trialflow.presentation.views import RunningView
from trialflow.records.changed_trials import ChangedTrials
from trialflow.records.store import Metric


def _store_with_ended_trials(tmp_path, ended: int):
    """A store with ``ended`` SUCCEEDED trials (final result: their number) that ended over half a
    second ago."""
    exp_id, exp_dir = create_experiment(parse_config(base_config(tmp_path, tmp_path / "w", maxTrialNumber=ended + 3)))
    store = open_store(exp_dir.parent, exp_id)
    for n in range(ended):
        store.add_trial(f"old{n}", None, n, {"x": n}, {})
        store.set_status(f"old{n}", "RUNNING")
        store.add_metrics([Metric(f"old{n}", "FINAL", 0, float(n))])
        store.set_status(f"old{n}", "SUCCEEDED", 0)
    time.sleep(0.5)
    return exp_id, exp_dir, store


def test_a_later_read_returns_the_active_trials_and_those_that_changed_since_not_those_ended_before(tmp_path):
    _, _, store = _store_with_ended_trials(tmp_path, 50)
    store.add_trial("run", None, 50, {"x": 0}, {})
    store.set_status("run", "RUNNING")
    changed = ChangedTrials(store, slack=0.2)
    assert len(changed.read()) == 51  # the first read: every trial
    assert [t.id for t in changed.read()] == ["run"]  # still running: read at every refresh
    store.add_trial("new", None, 51, {"x": 1}, {})
    store.set_status("run", "SUCCEEDED", 0)
    assert [(t.id, t.status) for t in changed.read()] == [("run", "SUCCEEDED"), ("new", "WAITING")]
    assert [t.id for t in changed.read()] == ["run", "new"]  # ended within the slack: looked at again
    time.sleep(0.5)
    changed.read()
    assert [t.id for t in changed.read()] == ["new"]  # a read began over the slack after its end
    assert [t.id for t in ChangedTrials(store, slack=0.0).read()[-2:]] == ["run", "new"]
    store.close()


def _rows(view: _LiveView) -> dict[str, str]:
    """The live table's rows as a user reads them: label -> value."""
    console = Console(record=True, width=200)
    console.print(view.table())
    cells = (line.strip("│ ").split("│") for line in console.export_text().splitlines() if line.startswith("│"))
    return {label.strip(): value.strip() for label, value in cells}


def test_the_live_table_follows_the_trials_as_they_change_without_rereading_those_ended_before(tmp_path):
    exp_id, exp_dir, store = _store_with_ended_trials(tmp_path, 200)
    view = _LiveView(exp_dir.parent, exp_id, slack=0.2)
    try:
        first = _rows(view)
        assert first["trials done"] == "200 / 203" and first["best so far"] == "199.0 (old199) {'x': 199}"
        store.add_trial("a", None, 200, {"x": 0.5}, {})
        store.set_status("a", "RUNNING")
        store.add_trial("b", None, 201, {"x": 0.7}, {})
        seen = _rows(view)
        assert seen["trials done"] == "200 / 203" and seen["running"] == "a#200, b#201"
        assert len(view._kept.changed.read()) == 2  # a refresh reads the two active trials, not the 200 ended
        store.add_metrics([Metric("a", "FINAL", 0, 1000.0)])
        store.set_status("a", "SUCCEEDED", 0)
        store.set_status("b", "RUNNING")
        store.set_status("b", "FAILED", 1)
        last = _rows(view)
        assert last["trials done"] == "202 / 203" and last["best so far"] == "1000.0 (a) {'x': 0.5}"
        assert last["running"] == "-"
        assert [t.id for t in view.trials][-3:] == ["old199", "a", "b"]
    finally:
        view.close()
        store.close()


def _top_rows(view: RunningView) -> tuple[list[list[str]], list[list[str]]]:
    """`trialflow top`'s two tables as a user reads them: the experiments' rows, then the live trials'."""
    console = Console(record=True, width=200)
    console.print(view.table())
    tables: list[list[list[str]]] = [[], []]
    which = -1
    for line in console.export_text().splitlines():
        if line.startswith("┏"):
            which += 1
        elif line.startswith("│"):
            tables[which].append([cell.strip() for cell in line.strip("│").split("│")])
    return tables[0], tables[1]


def test_top_follows_running_experiments_without_rereading_trials_ended_before(tmp_path):
    """`trialflow top` keeps each running experiment's store between refreshes and reads only the
    trials that changed and the latest result of its live ones: its rows stay right while a refresh
    reads 2 trials of 202."""
    exp_id, exp_dir, store = _store_with_ended_trials(tmp_path, 200)
    store.add_trial("a", None, 200, {"x": 0.5}, {})
    store.set_status("a", "RUNNING")
    store.add_metrics([Metric("a", "PERIODICAL", i, float(i)) for i in range(3)])
    store.add_trial("b", None, 201, {"x": 0.7}, {})
    view = RunningView(tmp_path / "w", slack=0.2)
    try:
        experiments, live = _top_rows(view)
        assert experiments == [[exp_id, "", "INITIALIZED", "202", "2", "200", "0", "199.0 (old199)"]]
        assert [(row[1], row[3], row[5]) for row in live] == [("a", "RUNNING", "2.0"), ("b", "WAITING", "")]
        [followed] = view._followed.values()
        assert len(followed.kept.changed.read()) == 2  # a refresh reads the two active trials, not the 200 ended
        store.add_metrics([Metric("a", "PERIODICAL", 3, 7.5), Metric("a", "FINAL", 0, 1000.0)])
        store.set_status("a", "SUCCEEDED", 0)
        store.set_status("b", "RUNNING")
        experiments, live = _top_rows(view)
        assert experiments == [[exp_id, "", "INITIALIZED", "202", "1", "201", "0", "1000.0 (a)"]]
        assert [(row[1], row[3]) for row in live] == [("b", "RUNNING")]
        store.set_status("b", "FAILED", 1)
        store.set_experiment(status="DONE", end_time=time.time(), best_trial="a")
        assert _top_rows(view) == ([], []) and view._followed == {}  # an ended experiment's store is closed
    finally:
        view.close()
        store.close()
