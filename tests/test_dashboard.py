"""Charts: the live optuna-dashboard (its own HTTP API and headless Chromium), the Optuna mirror's
mapping, the HTML report and the Prefect UI's dashboard link."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import optuna
import pytest
import yaml

from tests.conftest import base_config, write_trial
from tests.test_cli import cli
from trialflow import parse_config
from trialflow.experiments import create_experiment, open_store
from trialflow.presentation.dashboard import LiveDashboard, open_mirror
from trialflow.presentation.report import write_report
from trialflow.records.store import Metric

TRIAL = """\
import os, sys, time, nni
p = nni.get_next_parameter()
while os.path.exists(sys.argv[1]):  # held until the dashboard has looked once
    time.sleep(0.1)
for step in range(3):
    nni.report_intermediate_result(p['x'] * step)
    time.sleep(1.0)  # the study is seen growing
if p['x'] > 0.9:
    raise SystemExit(3)
nni.report_final_result(p['x'])
"""


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def _dump_dom(chromium: str, url: str, tmp_path: Path) -> str:
    proc = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           f"--user-data-dir={tmp_path / 'chromium'}", "--virtual-time-budget=15000",
                           "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.timeout(600)
def test_dashboard_follows_a_running_experiment_and_renders_in_chromium(tmp_path, prefect_server, chromium):
    code = tmp_path / "code"
    write_trial(code, TRIAL)
    hold = tmp_path / "hold"
    hold.touch()
    config = tmp_path / "config.yml"
    config.write_text(yaml.safe_dump(base_config(code, tmp_path / "w", maxTrialNumber=6, experimentName="charts",
                                                 trialCommand=f"{sys.executable} trial.py {hold}")))
    env = {"PREFECT_API_URL": prefect_server, "TRIALFLOW_HOME": str(tmp_path / "home")}
    created = cli("create", "--config", str(config), env=env)
    assert created.returncode == 0, created.stdout + created.stderr
    exp_id = created.stdout.split("experiment id:")[1].split()[0]
    dash = subprocess.Popen([sys.executable, "-m", "trialflow.cli", "dashboard", exp_id, "--port", "0",
                             "--root", str(tmp_path / "w")], env={**os.environ, **env, "COLUMNS": "300"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        line = dash.stdout.readline()  # type: ignore[union-attr]
        match = re.search(r"(http://127\.0\.0\.1:\d+)/dashboard/studies/(\d+)", line)
        assert match, line + dash.stdout.read(2000)  # type: ignore[union-attr]
        base, study_id = match.group(1), int(match.group(2))
        assert _get(f"{base}/api/studies")["study_summaries"][0]["study_name"] == f"charts ({exp_id})"
        seen: list[int] = []  # finished trials per look
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            detail = _get(f"{base}/api/studies/{study_id}")
            finished = [t for t in detail["trials"] if t["state"] in ("Complete", "Fail", "Pruned")]
            if not seen or len(finished) != seen[-1]:
                seen.append(len(finished))
            hold.unlink(missing_ok=True)  # the trials go on once the dashboard has answered
            if len(finished) == 6:
                break
            time.sleep(0.3)
        assert seen[-1] == 6 and len(seen) >= 3, f"the study did not grow as trials finished: {seen}"
        listing = {t["user_attrs"][0]["value"]: t for t in detail["trials"]}  # by trialflow trial id
        store = open_store(tmp_path / "w", exp_id)
        for trial in store.trials():
            shown = listing[trial.id]
            expected = {"SUCCEEDED": "Complete", "FAILED": "Fail"}[trial.status]
            assert shown["state"] == expected
            x = trial.parameters["x"]
            assert [iv["value"] for iv in shown["intermediate_values"]] == pytest.approx([0, x, 2 * x])
            if expected == "Complete":
                assert shown["values"] == [pytest.approx(x)]
        # the page itself, rendered by a real browser
        dom = _dump_dom(chromium, f"{base}/dashboard/studies/{study_id}", tmp_path)
        assert f"charts ({exp_id})" in dom
        assert store.controls()["dashboard_url"] == f"{base}/dashboard/studies/{study_id}"
    finally:
        os.killpg(dash.pid, signal.SIGTERM)
        dash.wait(timeout=30)
    assert dash.returncode == 0
    assert open_store(tmp_path / "w", exp_id).controls()["dashboard_url"] is None  # a stopped one is unlisted


def _experiment(tmp_path: Path, space: dict, name: str = "mirror", **fields):
    exp_id, exp_dir = create_experiment(parse_config(base_config(tmp_path, tmp_path / "w", searchSpace=space,
                                                                 experimentName=name, **fields)))
    return open_store(exp_dir.parent, exp_id), exp_dir


NESTED = {"lr": {"_type": "loguniform", "_value": [1e-5, 1e-1]},
          "model": {"_type": "choice", "_value": [{"_name": "svm", "C": {"_type": "uniform", "_value": [0, 10]}},
                                                  {"_name": "tree"}]},
          "combine": {"_type": "choice", "_value": [{"optimizer": "Adam", "lr": 1e-5}, 3]},
          "layers": {"_type": "randint", "_value": [1, 5]}}


def test_mirror_maps_nested_choices_states_and_resumes_without_duplicates(tmp_path):
    store, exp_dir = _experiment(tmp_path, NESTED)
    store.add_trial("A", None, 0, {"lr": 0.01, "model": {"_name": "svm", "C": 2.5},
                                   "combine": {"optimizer": "Adam", "lr": 1e-5}, "layers": 3}, {})
    store.set_status("A", "RUNNING")
    store.add_metrics([Metric("A", "PERIODICAL", 0, 0.5), Metric("A", "PERIODICAL", 1, float("nan"))])
    store.add_trial("W", None, 1, {"lr": 0.02, "model": {"_name": "tree"}, "combine": 3, "layers": 1}, {})
    url = f"sqlite:///{tmp_path / 'study.db'}"
    mirror = open_mirror(store, url, "s")
    assert mirror.sync() == 1  # the WAITING trial is not shown yet
    running = optuna.load_study(study_name="s", storage=url).trials
    assert [t.state for t in running] == [optuna.trial.TrialState.RUNNING]
    assert running[0].intermediate_values == {0: 0.5}  # NaN left out
    assert running[0].params == {"lr": 0.01, "model": "svm", "model/svm/C": 2.5,
                                 "combine": '{"lr": 1e-05, "optimizer": "Adam"}', "layers": 3}
    assert running[0].distributions["lr"].log and running[0].distributions["layers"].high == 4
    store.add_metrics([Metric("A", "PERIODICAL", 2, 0.7), Metric("A", "FINAL", 0, {"default": 0.9, "loss": 1})])
    store.set_status("A", "SUCCEEDED", 0)
    store.set_status("W", "RUNNING")
    store.set_status("W", "EARLY_STOPPED")
    store.add_trial("F", None, 2, {"lr": 0.03, "model": {"_name": "tree"}, "combine": 3, "layers": 9,
                                   "extra": "x"}, {})
    store.set_status("F", "RUNNING")
    store.set_status("F", "FAILED", 1)
    assert mirror.sync() == 3
    again = open_mirror(store, url, "s")  # a restarted dashboard carries on
    assert again.sync() == 0 and again.trial_count == 3
    trials = {t.user_attrs["trialflow_trial_id"]: t for t in optuna.load_study(study_name="s", storage=url).trials}
    assert len(trials) == 3
    assert trials["A"].state == optuna.trial.TrialState.COMPLETE and trials["A"].value == 0.9
    assert trials["A"].intermediate_values == {0: 0.5, 2: 0.7} and trials["A"].user_attrs["final"]["loss"] == 1
    assert trials["W"].state == optuna.trial.TrialState.PRUNED and trials["W"].params["model"] == "tree"
    assert trials["F"].state == optuna.trial.TrialState.FAIL
    assert trials["F"].user_attrs["param:layers"] == 9 and trials["F"].user_attrs["param:extra"] == "x"
    assert "layers" not in trials["F"].params  # outside randint's range: kept as an attribute


def test_dashboard_in_process_serves_and_clears_its_address(tmp_path):
    store, exp_dir = _experiment(tmp_path, {"x": {"_type": "uniform", "_value": [0, 1]}}, name=None)
    store.add_trial("A", None, 0, {"x": 0.25}, {})
    store.set_status("A", "RUNNING")
    with LiveDashboard(store, open_mirror(store, optuna.storages.InMemoryStorage()), interval=0.1) as dash:
        base = dash.url.split("/dashboard/")[0]
        assert store.controls()["dashboard_url"] == dash.url
        store.add_metrics([Metric("A", "FINAL", 0, 0.25)])
        store.set_status("A", "SUCCEEDED", 0)
        deadline = time.monotonic() + 30
        while _get(f"{base}/api/studies/0")["trials"][0]["state"] != "Complete":
            assert time.monotonic() < deadline, "the finished trial never reached the dashboard"
            time.sleep(0.1)
        busy = LiveDashboard(store, open_mirror(store, optuna.storages.InMemoryStorage()),
                             port=int(base.rsplit(":", 1)[1]))
        with pytest.raises(OSError, match="choose another --port"):
            busy.start()
    assert store.controls()["dashboard_url"] is None


def _fifty_trials(tmp_path: Path):
    store, _ = _experiment(tmp_path, {"x": {"_type": "uniform", "_value": [0, 1]},
                                      "k": {"_type": "choice", "_value": [1, 2, 3]}}, name="report",
                           maxTrialNumber=50, tuner={"name": "TPE", "classArgs": {"optimize_mode": "minimize"}})
    rng = random.Random(7)
    for i in range(50):
        trial = f"T{i:02d}"
        x, k = rng.random(), rng.choice([1, 2, 3])
        store.add_trial(trial, None, i, {"x": x, "k": k}, {})
        store.set_status(trial, "RUNNING")
        store.add_metrics([Metric(trial, "PERIODICAL", s, x * s + k) for s in range(4)])
        if i % 10 == 9:
            store.set_status(trial, "EARLY_STOPPED")
        else:
            store.add_metrics([Metric(trial, "FINAL", 0, (x - 0.3) ** 2 + k / 10)])
            store.set_status(trial, "SUCCEEDED", 0)
    return store


def _figures(page: str) -> list[tuple[list, dict]]:
    """Every plotly figure's (data, layout) in a report written by plotly's to_html."""
    decoder = json.JSONDecoder()
    figures = []
    for match in re.finditer(r"Plotly\.newPlot\(\s*\"[^\"]+\",\s*", page):
        data, end = decoder.raw_decode(page, match.end())
        layout, _ = decoder.raw_decode(page, end + page[end:].index("{"))
        figures.append((data, layout))
    return figures


def test_report_of_fifty_trials_holds_every_chart_and_opens_offline(tmp_path, chromium):
    store = _fifty_trials(tmp_path)
    out = tmp_path / "report.html"
    drawn = write_report(store, out)
    assert all(why is None for why in drawn.values()), drawn
    page = out.read_text(encoding="utf-8")
    assert not re.search(r"<script[^>]+src=", page) and "<link" not in page  # nothing fetched when opened
    figures = {layout["title"]["text"]: data for data, layout in _figures(page)}
    assert set(figures) == set(drawn)
    history = {t["name"]: t for t in figures["Metric over trials (best so far as a line)"]}
    values = history["SUCCEEDED"]["y"]
    assert len(values) == 45  # the 45 that finished with a value ...
    stopped = history["EARLY_STOPPED (last intermediate result)"]
    assert sorted(stopped["text"]) == [f"T{i:02d}" for i in range(9, 50, 10)]  # ... and the 5 stopped early
    last = {m.trial_id: m.value for m in store.metrics(type="PERIODICAL")}
    assert stopped["y"] == [last[t] for t in stopped["text"]]
    best_line = history["Best Value"]["y"]  # the succeeded trials' best so far (minimized)
    assert best_line[-1] == min(values) and all(b <= a for a, b in zip(best_line, best_line[1:], strict=False))
    assert len(figures["Intermediate results"]) == 50 and all(len(t["y"]) == 4 for t in figures["Intermediate results"])
    (parallel,) = figures["Hyper-parameters (parallel coordinates)"]
    dimensions = {d["label"]: d for d in parallel["dimensions"]}
    assert list(dimensions) == ["metric", "k", "x", "status"]  # one line per trial, every one of the 50
    assert all(len(d["values"]) == 50 for d in dimensions.values())
    assert sorted(dimensions["status"]["ticktext"]) == ["EARLY_STOPPED", "SUCCEEDED"]
    assert set(figures["Parameter importance"][0]["y"]) == {"x", "k"}
    durations = figures["Duration per trial"]
    assert sum(len(t["x"]) for t in durations) == 50 and {t["name"] for t in durations} == {"SUCCEEDED",
                                                                                           "EARLY_STOPPED"}
    # and a browser with no network draws them
    dom = _dump_dom(chromium, out.as_uri(), tmp_path)
    assert dom.count('class="main-svg"') >= 2 * len(figures)


def test_report_of_an_experiment_without_intermediates_says_what_is_missing(tmp_path):
    store, _ = _experiment(tmp_path, {"x": {"_type": "uniform", "_value": [0, 1]}})
    store.add_trial("A", None, 0, {"x": 0.5}, {})
    store.set_status("A", "RUNNING")
    store.add_metrics([Metric("A", "FINAL", 0, 0.5)])
    store.set_status("A", "SUCCEEDED", 0)
    proc = cli("experiment", "report", store.experiment_id, "-o", str(tmp_path / "r.html"),
               "--root", str(tmp_path / "w"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Intermediate results: not available" in proc.stdout
    assert "not available" in (tmp_path / "r.html").read_text(encoding="utf-8")
