"""The experiment flow end to end on the local service (real processes, Prefect test server)."""

from __future__ import annotations

import itertools
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import base_config, run_in_thread, start_controller, wait_for, write_trial
from trialflow import parse_config, run_experiment
from trialflow.experiments import create_experiment, open_store
from trialflow.records.store import Control

pytestmark = pytest.mark.usefixtures("prefect_server")

INTERVAL_TRIAL = """
import json, os, time, nni, fcntl
p = nni.get_next_parameter()
log = os.path.join(os.path.dirname(os.path.abspath(__file__)), "intervals.jsonl")
def mark(kind):
    with open(log, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(json.dumps({"trial": nni.get_trial_id(), "kind": kind, "t": time.time()}) + "\\n")
mark("start")
deadline = time.time() + 60  # the first trials wait until this many have started, their starts seconds apart under load
while time.time() < deadline and open(log).read().count('"start"') < int(os.environ.get("TRIAL_TOGETHER", "0")):
    time.sleep(0.05)
time.sleep(float(os.environ.get("TRIAL_SLEEP", "0.4")))
while os.path.exists(os.environ.get("TRIAL_HOLD", "")):  # the test holds the trial until it has acted
    time.sleep(0.05)
nni.report_final_result(p["x"])
mark("end")
"""


def _max_overlap(log: Path) -> int:
    events = [json.loads(line) for line in log.read_text().splitlines()]
    points = sorted((e["t"], 1 if e["kind"] == "start" else -1) for e in events)
    live = peak = 0
    for _, delta in sorted(points, key=lambda p: (p[0], p[1])):
        live += delta
        peak = max(peak, live)
    return peak


def test_concurrency_is_never_exceeded_and_max_trial_number_is_exact(tmp_path, monkeypatch):
    code = tmp_path / "code"
    write_trial(code, INTERVAL_TRIAL)
    monkeypatch.setenv("TRIAL_TOGETHER", "3")  # the window filled however slowly trials start
    result = run_experiment(base_config(code, tmp_path / "w", trialConcurrency=3, maxTrialNumber=9))
    assert result.status == "DONE"
    assert len(result.trials) == 9
    assert all(t.status == "SUCCEEDED" for t in result.trials)
    assert _max_overlap(code / "intervals.jsonl") == 3  # never more, and the window is filled
    starts = [json.loads(x)["trial"] for x in (code / "intervals.jsonl").read_text().splitlines()
              if '"start"' in x]
    assert sorted(starts) == sorted(t.id for t in result.trials)  # each trial ran exactly once
    best = max(result.trials, key=lambda t: t.final)
    # no optimize_mode anywhere: NNI's rule is maximize
    assert result.best is not None and result.best.id == best.id
    assert best.parameters["x"] == best.final  # the trial got its own parameters


def test_parameters_recorded_equal_parameters_received(tmp_path):
    code = tmp_path / "code"
    write_trial(code, "import nni\np = nni.get_next_parameter()\nnni.report_final_result({'default': 1, 'p': p})\n")
    result = run_experiment(base_config(code, tmp_path / "w", trialConcurrency=4, maxTrialNumber=8))
    for t in result.trials:
        assert t.final["p"] == t.parameters


def test_failing_trial_is_failed_with_exit_code_and_experiment_goes_on(tmp_path):
    code = tmp_path / "code"
    write_trial(code, "import sys, nni\np = nni.get_next_parameter()\n"
                      "if p['x'] > 0.5: sys.exit(7)\nnni.report_final_result(p['x'])\n")
    config = base_config(code, tmp_path / "w", maxTrialNumber=6,
                         searchSpace={"x": {"_type": "choice", "_value": [0.25, 0.75]}},
                         tuner={"name": "GridSearch"})
    result = run_experiment(config)
    assert result.status == "DONE"
    by_x = {t.parameters["x"]: t for t in result.trials}
    assert len(result.trials) == 2  # the grid is exhausted before maxTrialNumber
    assert by_x[0.75].status == "FAILED" and by_x[0.75].exit_code == 7
    assert by_x[0.25].status == "SUCCEEDED"


def test_max_trial_duration_ends_trials_early_stopped(tmp_path):
    code = tmp_path / "code"
    write_trial(code, "import time, nni\nnni.get_next_parameter()\nnni.report_intermediate_result(1)\ntime.sleep(60)\n")
    started = time.monotonic()
    result = run_experiment(base_config(code, tmp_path / "w", maxTrialNumber=2, maxTrialDuration="2s"))
    assert time.monotonic() - started < 45
    assert [t.status for t in result.trials] == ["EARLY_STOPPED", "EARLY_STOPPED"]
    store = open_store(tmp_path / "w", result.experiment_id)
    assert all(len(store.metrics(t.id, "PERIODICAL")) == 1 for t in result.trials)  # metrics kept


def _quiet_polls_counted(monkeypatch) -> list[tuple[str, float]]:
    """Count the local service's polls (trial id, time) and let a quiet trial's waits grow to 30 s:
    only a wake-up (its end, a cancel, the stop) or its time limit ends one sooner."""
    from trialflow.platforms.local import LocalTrainingService

    polls: list[tuple[str, float]] = []
    real_poll = LocalTrainingService.poll

    def counted(self, handle, cursor):
        polls.append((handle.trial_id, time.monotonic()))
        return real_poll(self, handle, cursor)

    monkeypatch.setattr(LocalTrainingService, "poll", counted)
    monkeypatch.setattr(LocalTrainingService, "quiet_poll_seconds", 30.0)
    return polls


def test_a_quiet_trial_is_polled_seldom_and_a_kill_and_the_stop_still_land_at_once(tmp_path, monkeypatch):
    """A controller following sleeping trials stays idle: a running trial that reports nothing is
    polled less and less often, and the experiment loop looks at its controls less and less often, while
    a kill and the experiment's stop still land within seconds: writing them wakes the loop."""
    polls = _quiet_polls_counted(monkeypatch)
    from trialflow.records.store import ExperimentStore

    looks: list[float] = []  # the experiment loop's reads of its controls
    real_controls = ExperimentStore.controls

    def counted_controls(self):
        if threading.current_thread().name == "experiment-run":
            looks.append(time.monotonic())
        return real_controls(self)

    monkeypatch.setattr(ExperimentStore, "controls", counted_controls)
    code = tmp_path / "code"
    write_trial(code, "import time, nni\nnni.get_next_parameter()\ntime.sleep(120)\n")
    from trialflow.flows.experiment import run_experiment_flow

    exp_id, exp_dir = create_experiment(parse_config(base_config(code, tmp_path / "w", trialConcurrency=2,
                                                                 maxTrialNumber=2)))
    store = open_store(exp_dir.parent, exp_id)
    runner, _ = run_in_thread(lambda: run_experiment_flow(None, exp_id, str(exp_dir.parent)), name="experiment-run")
    try:
        first, second = wait_for(lambda: store.trials(["RUNNING"]) if len(store.trials(["RUNNING"])) == 2 else None,
                                 timeout=60)
        time.sleep(6)  # the loop's waits: 0.25, 0.5, then a second each
        assert sum(1 for at in looks if at > time.monotonic() - 5) <= 7  # every 0.25 s: 20
        # from here the loop's waits go on doubling, 2, 4, 8 s (~14 s on), then 16 s: no look of its own lands
        # the kill below soon. Its follower's waits: 0.2, 0.4, ... 6.4 s (polled ~12.6 s in), then 12.8 s
        monkeypatch.setattr("trialflow.flows.trial_loop.QUIET_TICK_SECONDS", 60.0)

        def gaps() -> list[float]:  # between the loop's looks (a look may read its controls twice)
            return [later - at for at, later in itertools.pairwise(list(looks)) if later - at > 0.1]

        wait_for(lambda: any(gap > 7 for gap in gaps()), timeout=60, interval=0.05)
        time.sleep(0.5)
        now = time.monotonic()
        assert sum(1 for trial, at in polls if trial == first.id and at > now - 5) <= 2  # every 0.2 s: 25
        assert sum(1 for gap in gaps() if gap > 1.5) >= 3  # the waits grew 2, 4, 8 s
        store.set_control(Control.KILL, [first.id])
        asked = time.monotonic()
        wait_for(lambda: store.trial(first.id).status == "USER_CANCELED", timeout=30, interval=0.05)
        assert time.monotonic() - asked < 5  # unwoken, the loop would look ~15 s later
        store.set_control(Control.STOP, True)
        asked = time.monotonic()
        runner.join(timeout=30)
        assert not runner.is_alive() and time.monotonic() - asked < 10
    finally:  # a failed assertion still ends the run before the test's environment is taken back
        store.set_control(Control.STOP, True)
        runner.join(timeout=60)
    assert store.experiment().status == "STOPPED" and [t.status for t in store.trials()] == ["USER_CANCELED"] * 2


def test_a_quiet_trials_longer_waits_end_by_its_max_trial_duration(tmp_path, monkeypatch):
    _quiet_polls_counted(monkeypatch)
    code = tmp_path / "code"
    write_trial(code, "import time, nni\nnni.get_next_parameter()\ntime.sleep(60)\n")
    result = run_experiment(base_config(code, tmp_path / "w", maxTrialNumber=1, maxTrialDuration="4s"))
    [trial] = result.trials
    assert trial.status == "EARLY_STOPPED" and trial.end_time - trial.start_time < 6.5


def test_max_experiment_duration_stops_creating_trials_then_done(tmp_path):
    code = tmp_path / "code"
    write_trial(code, "import time, nni\nnni.get_next_parameter()\ntime.sleep(1.5)\nnni.report_final_result(1)\n")
    result = run_experiment(base_config(code, tmp_path / "w", maxTrialNumber=100, maxExperimentDuration="3s"))
    assert result.status == "DONE"
    assert 2 <= len(result.trials) <= 6
    assert all(t.status == "SUCCEEDED" for t in result.trials)  # running trials were let finish


def test_the_assessor_stops_bad_trials_at_report_time_before_their_next_step(tmp_path):
    """Local trials ask the assessor as they report (the report desk): a trial whose result falls
    below the median waits for the verdict and is EARLY_STOPPED before it begins another step,
    however short its steps; the others run to the end."""
    code = tmp_path / "code"
    write_trial(code, """
import os, time, nni
p = nni.get_next_parameter()
for step in range(12):
    with open(os.path.join(os.environ["NNI_OUTPUT_DIR"], "began"), "a") as f:
        f.write(f"{step}\\n")
    time.sleep(0.02)
    nni.report_intermediate_result(p["x"])
nni.report_final_result(p["x"])
""")
    config = base_config(code, tmp_path / "w", trialConcurrency=1, maxTrialNumber=4,
                         searchSpace={"x": {"_type": "choice", "_value": [1, 10, 0, 0.5]}},
                         tuner={"name": "GridSearch"},
                         assessor={"name": "Medianstop", "classArgs": {"optimize_mode": "maximize", "start_step": 2}})
    result = run_experiment(config)
    store = open_store(result.directory.parent, result.experiment_id)
    trials = {t.parameters["x"]: t for t in result.trials}
    # 1 runs first (nothing to compare with), 10 beats the median, 0 and 0.5 fall below it
    assert trials[1].status == "SUCCEEDED" and trials[10].status == "SUCCEEDED"
    assert trials[0].status == "EARLY_STOPPED" and trials[0.5].status == "EARLY_STOPPED"
    for x in (0, 0.5):  # stopped at its first result the median can judge (the third), no step begun after
        began = (result.directory / "trials" / trials[x].id / "began").read_text().split()
        assert began == ["0", "1", "2"], (x, began)
        assert len(store.metrics(trials[x].id, "PERIODICAL")) == 3
    assert trials[10].status == "SUCCEEDED" and len(store.metrics(trials[10].id, "PERIODICAL")) == 12


def test_invalid_final_metric_is_reported_and_experiment_goes_on(tmp_path):
    code = tmp_path / "code"
    write_trial(code, "import nni\nnni.get_next_parameter()\nnni.report_final_result('not a number')\n")
    result = run_experiment(base_config(code, tmp_path / "w", maxTrialNumber=2))
    assert result.status == "DONE" and [t.status for t in result.trials] == ["SUCCEEDED", "SUCCEEDED"]
    assert result.best is None and result.trials[0].final == "not a number"


def test_resume_after_sigkill_reattaches_and_loses_nothing(tmp_path, prefect_server, store_url):
    code = tmp_path / "code"
    write_trial(code, INTERVAL_TRIAL)
    hold = tmp_path / "hold"  # while it exists, trials past their sleep wait: two run at the kill, however slow
    os.environ.update(TRIAL_SLEEP="1", TRIAL_HOLD=str(hold))
    shared = {} if store_url.startswith("sqlite") else {"storeUrl": store_url}  # sqlite: the embedded default
    try:
        cfg = parse_config(base_config(code, tmp_path / "w", trialConcurrency=2, maxTrialNumber=5, **shared))
        exp_id, exp_dir = create_experiment(cfg)
        store = open_store(exp_dir.parent, exp_id)
        first = start_controller(exp_id, exp_dir.parent, prefect_server)
        wait_for(lambda: len(store.trials(["SUCCEEDED"])) >= 1)
        hold.touch()
        wait_for(lambda: len(store.trials(["RUNNING"])) == 2)
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        alive = {t.id for t in store.trials(["RUNNING", "WAITING"])}
        assert alive, "no trial was running at the kill"
        hold.unlink()
        second = start_controller(exp_id, exp_dir.parent, prefect_server)
        assert second.wait(timeout=120) == 0
    finally:
        hold.unlink(missing_ok=True)
        os.environ.pop("TRIAL_SLEEP", None)
        os.environ.pop("TRIAL_HOLD", None)
    trials = store.trials()
    assert store.experiment().status == "DONE"
    assert len(trials) == 5 and all(t.status == "SUCCEEDED" for t in trials)
    starts = [json.loads(x)["trial"] for x in (code / "intervals.jsonl").read_text().splitlines() if '"start"' in x]
    assert sorted(starts) == sorted(t.id for t in trials), "a trial ran twice or not at all"
    for t in trials:
        assert [s for s, _, _ in store.status_history(t.id)].count("SUCCEEDED") == 1
        assert len(store.metrics(t.id, "FINAL")) == 1
    assert store.url == (store_url if shared else store.url)
    assert (exp_dir / "db" / "trialflow.sqlite").exists() == (not shared)


# a training script that saves its work on Ctrl-C and exits 1 answers the stop with a code of its own
SAVES_ON_SIGINT = ("import sys, time, nni\nnni.get_next_parameter()\ntry:\n    time.sleep(60)\n"
                   "except KeyboardInterrupt:\n    sys.exit(1)\n")


@pytest.mark.parametrize("trial", ["import time, nni\nnni.get_next_parameter()\ntime.sleep(60)\n", SAVES_ON_SIGINT],
                         ids=["sleeps", "exits-1-on-sigint"])
def test_user_kill_and_stop_through_the_store_controls(tmp_path, prefect_server, trial):
    """Killed and stopped trials are USER_CANCELED, also when they answer the stop signal with an exit
    code of their own (they ended because of the stop, not by themselves)."""
    code = tmp_path / "code"
    write_trial(code, trial)
    cfg = parse_config(base_config(code, tmp_path / "w", trialConcurrency=2, maxTrialNumber=3))
    exp_id, exp_dir = create_experiment(cfg)
    store = open_store(exp_dir.parent, exp_id)
    proc = start_controller(exp_id, exp_dir.parent, prefect_server)
    running = wait_for(lambda: store.trials(["RUNNING"]) if len(store.trials(["RUNNING"])) == 2 else None)
    store.set_control(Control.KILL, [running[0].id])
    wait_for(lambda: store.trial(running[0].id).status == "USER_CANCELED")
    wait_for(lambda: len(store.trials(["RUNNING"])) == 2)  # the killed trial's slot is refilled
    store.set_control(Control.STOP, True)
    assert proc.wait(timeout=60) == 0
    assert store.experiment().status == "STOPPED"
    assert [t.status for t in store.trials()] == ["USER_CANCELED"] * 3, [(t.status, t.message) for t in store.trials()]
    assert len(store.trials()) == 3  # the killed trial was replaced, then the stop cancelled the rest


@pytest.mark.usefixtures("prefect_server")
def test_a_users_own_flow_composed_from_the_task_library(tmp_path):
    from prefect import flow

    import trialflow
    from trialflow.tasks import poll_trial, submit_trial, upload_code

    code = tmp_path / "code"
    write_trial(code, "import nni\np = nni.get_next_parameter()\nnni.report_final_result(p['lr'] * 2)\n")

    @flow
    def hand_picked() -> tuple[str, str]:
        space = {"lr": {"_type": "uniform", "_value": [0, 1]}}
        with trialflow.experiment_session(base_config(code, tmp_path / "w", searchSpace=space)) as exp:
            upload_code(exp.id, str(code))
            trial = exp.add_trial({"lr": 0.25})
            submit_trial(exp.id, trial)
            state = poll_trial(exp.id, trial, return_state=True)
            return exp.id, state.type.value

    experiment_id, state = hand_picked()
    assert state == "COMPLETED"
    store = open_store(tmp_path / "w", experiment_id)
    [trial] = store.trials()
    assert trial.status == "SUCCEEDED" and trial.final == 0.5 and trial.parameters == {"lr": 0.25}
    assert store.experiment().status == "DONE"


@pytest.mark.usefixtures("prefect_server")
def test_import_into_an_experiment_made_from_a_search_space_file_reaches_the_tuner(tmp_path):
    import subprocess

    import yaml

    from trialflow.config import load_config
    from trialflow.flows.experiment import experiment_flow

    code = tmp_path / "code"
    write_trial(code, "import nni\np = nni.get_next_parameter()\nnni.report_final_result(p['x'])\n")
    (tmp_path / "space.json").write_text(json.dumps({"x": {"_type": "choice", "_value": [1, 2, 3]}}))
    config = base_config(code, tmp_path / "w", maxTrialNumber=3, tuner={"name": "GridSearch"},
                         searchSpaceFile="space.json")
    del config["searchSpace"]
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(config))
    experiment_id, exp_dir = create_experiment(load_config(path), str(path))
    (tmp_path / "data.json").write_text(json.dumps([{"parameter": {"x": 1}, "value": 1},
                                                    {"parameter": {"x": 2}, "value": 2}]))
    path.unlink()  # the stored copy alone must do
    done = subprocess.run(["trialflow", "experiment", "import", experiment_id, "-f",
                           str(tmp_path / "data.json")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TRIALFLOW_HOME": str(tmp_path / "w")})
    assert done.returncode == 0, done.stdout + done.stderr
    assert experiment_flow(None, experiment_id, str(exp_dir.parent)) == "DONE"
    trials = open_store(tmp_path / "w", experiment_id).trials()
    # the grid skipped the imported points, which are the tuner's data, not trials (NNI's importData)
    assert [t.parameters["x"] for t in trials] == [3]
    assert [p["x"] for p, _, _ in open_store(tmp_path / "w", experiment_id).imported()] == [1, 2]
    assert [t.status for t in trials] == ["SUCCEEDED"]
