"""Experiments that live on: a finished experiment continued with a larger budget (CLI and Python API),
and a new experiment warm-started from earlier ones (a stored experiment, an exported file), with a
search space that does not match refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.conftest import base_config, wait_for, write_trial
from tests.test_cli import cli
from trialflow import resume_experiment, run_experiment
from trialflow.app.control import UpdateError, controller_alive
from trialflow.experiments import list_experiments, open_store

SERVER = pytest.mark.usefixtures("prefect_server")  # the tests that run experiments

# each run of a trial appends its id to runs.log: a trial that ran twice shows twice
TRIAL = """
import os, nni
p = nni.get_next_parameter()
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "runs.log"), "a") as f:
    f.write(nni.get_trial_id() + "\\n")
nni.report_final_result(p["x"])
"""
GRID = {"x": {"_type": "choice", "_value": [1, 2, 3, 4, 5, 6]}}


def _grid_config(tmp_path: Path, trials: int, **extra) -> dict:
    write_trial(tmp_path / "code", TRIAL)
    return base_config(tmp_path / "code", tmp_path / "w", maxTrialNumber=trials, trialConcurrency=2,
                       searchSpace=GRID, tuner={"name": "GridSearch"}, **extra)


def _runs(tmp_path: Path) -> list[str]:
    return (tmp_path / "code" / "runs.log").read_text().split()


@SERVER
def test_a_finished_experiment_continues_from_the_cli_with_a_larger_budget_and_reruns_nothing(tmp_path):
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(_grid_config(tmp_path, 2)))
    done = cli("create", "--config", str(path), "--foreground")
    assert done.returncode == 0, done.stdout + done.stderr
    exp_id = done.stdout.split("experiment id:")[1].split()[0]

    refused = cli("resume", exp_id, "--trialnum", "2", "--root", str(tmp_path / "w"))
    assert refused.returncode == 1 and len(refused.stdout.strip().splitlines()) == 1
    assert "--trialnum 2 is not more than the 2 trials" in refused.stdout

    more = cli("resume", exp_id, "--trialnum", "4", "--foreground", "--root", str(tmp_path / "w"))
    assert more.returncode == 0, more.stdout + more.stderr
    assert f"maxTrialNumber of {exp_id} set to 4 (2 run before)" in more.stdout
    store = open_store(tmp_path / "w", exp_id)
    trials = store.trials()
    assert store.experiment().status == "DONE" and len(trials) == 4
    assert sorted(_runs(tmp_path)) == sorted(t.id for t in trials)  # each trial ran once
    assert sorted(t.parameters["x"] for t in trials) == [1, 2, 3, 4]  # the grid went on where it stopped

    # nnictl's update of a DONE experiment's budget runs it on in the background, as NNI's manager does
    update = cli("update", "trialnum", exp_id, "5", "--root", str(tmp_path / "w"))
    assert update.returncode == 0 and f"maxTrialNumber of {exp_id} set to 5 (4 run before)" in update.stdout
    assert f"experiment {exp_id} started in the background" in update.stdout
    wait_for(lambda: store.count_trials() == 5 and store.experiment().status == "DONE"
             and not controller_alive(store), timeout=120)
    assert len(_runs(tmp_path)) == 5

    shown = json.loads(cli("experiment", "show", exp_id, "--root", str(tmp_path / "w")).stdout)
    assert shown["params"]["maxTrialNumber"] == 5 and "max_trial_number" not in shown["controls"]
    assert [(u["field"], u["value"], u["via"]) for u in shown["updates"]] == [
        ("maxTrialNumber", 4, "trialflow resume"), ("maxTrialNumber", 5, "trialflow update")]


@SERVER
def test_a_finished_experiment_continues_from_python(tmp_path):
    first = run_experiment(_grid_config(tmp_path, 3))
    assert first.status == "DONE" and len(first.trials) == 3
    with pytest.raises(UpdateError, match="not more than the 3 trials"):
        resume_experiment(first.experiment_id, tmp_path / "w", max_trial_number=3)
    result = resume_experiment(first.experiment_id, tmp_path / "w", max_trial_number=6)
    assert result.status == "DONE" and len(result.trials) == 6
    assert sorted(t.parameters["x"] for t in result.trials) == [1, 2, 3, 4, 5, 6]
    assert len(_runs(tmp_path)) == 6
    assert result.best is not None and result.best.final == 6


@SERVER
def test_warm_start_from_a_stored_experiment_and_from_an_exported_file(tmp_path):
    old = run_experiment(_grid_config(tmp_path, 3))
    assert {t.parameters["x"] for t in old.trials} == {1, 2, 3}

    # the grid tuner of a warm-started experiment knows the old points: it runs only the others
    warm = run_experiment(_grid_config(tmp_path, 6, warmStart=[old.experiment_id]))
    assert sorted(t.parameters["x"] for t in warm.trials) == [4, 5, 6]  # three of its own, then the grid ended
    store = open_store(tmp_path / "w", warm.experiment_id)
    assert store.imported_sources() == {old.experiment_id: 3}
    assert [v for _, _, v in store.imported()] == [1, 2, 3]
    assert warm.best is not None and warm.best.id in {t.id for t in warm.trials}  # never an imported result

    # an exported file, through the CLI option, reported in create's output
    exported = tmp_path / "old.json"
    assert cli("experiment", "export", old.experiment_id, "--filename", str(exported), "--root",
               str(tmp_path / "w")).returncode == 0
    path = tmp_path / "warm.yml"
    path.write_text(yaml.safe_dump(_grid_config(tmp_path, 6)))
    made = cli("create", "--config", str(path), "--foreground", "--warm-start", str(exported))
    assert made.returncode == 0, made.stdout + made.stderr
    assert f"warm start: 3 finished trials from {exported}" in made.stdout
    exp_id = made.stdout.split("experiment id:")[1].split()[0]
    assert sorted(t.parameters["x"] for t in open_store(tmp_path / "w", exp_id).trials()) == [4, 5, 6]


@SERVER
def test_a_warm_start_whose_search_space_does_not_match_is_one_line_and_creates_nothing(tmp_path):
    old = run_experiment(_grid_config(tmp_path, 2))
    config = _grid_config(tmp_path, 2, warmStart=[old.experiment_id])
    config["searchSpace"] = {"x": {"_type": "uniform", "_value": [0, 1]}, "y": {"_type": "choice", "_value": [1]}}
    config["tuner"] = {"name": "Random"}
    path = tmp_path / "bad.yml"
    path.write_text(yaml.safe_dump(config))
    before = [e.id for e in list_experiments(tmp_path / "w")]
    refused = cli("create", "--config", str(path))
    assert refused.returncode == 1, refused.stdout + refused.stderr
    line = refused.stdout.strip()
    assert "\n" not in line and "Traceback" not in refused.stderr
    assert f"warm start from experiment {old.experiment_id}" in line
    assert "parameter 'x' is choice there and uniform here" in line
    assert "parameter 'y' is not in its search space" in line
    assert [e.id for e in list_experiments(tmp_path / "w")] == before

    plain = tmp_path / "plain.yml"
    plain.write_text(yaml.safe_dump(_grid_config(tmp_path, 2)))
    missing = cli("create", "--config", str(plain), "--warm-start", str(tmp_path / "nope.json"))
    assert missing.returncode == 1 and "is neither a file nor an experiment id" in missing.stdout


def test_an_oversized_or_too_deeply_nested_warm_start_file_is_one_line(tmp_path, monkeypatch):
    import trialflow.experiments.result_exchange as result_exchange
    import trialflow.experiments.warm_start as warm_start
    from trialflow import parse_config

    big, deep = tmp_path / "big.json", tmp_path / "deep.json"
    deep.write_text("[" * 5000 + "]" * 5000)  # deeper than JSON can be read
    big.write_text(json.dumps([{"parameter": {"x": 1}, "value": 1.0}] * 1000))
    monkeypatch.setattr(result_exchange, "MAX_RESULTS_FILE_BYTES", deep.stat().st_size)
    assert big.stat().st_size > result_exchange.MAX_RESULTS_FILE_BYTES
    for path, said in ((big, f"a warm-start file may hold at most {result_exchange.MAX_RESULTS_FILE_BYTES}"),
                       (deep, "is not valid JSON: nested too deeply")):
        config = parse_config(_grid_config(tmp_path, 2, warmStart=[str(path)]))
        with pytest.raises(warm_start.WarmStartError, match=said) as caught:
            warm_start.gather(config, tmp_path / "w")
        assert "\n" not in str(caught.value)


# the trial logs each result once nni has taken it; the first trial reports "steps" results 0.3 s apart,
# the next one a single result, then each its final
REPORTING = """
import json, os, time, nni
p = nni.get_next_parameter()
ledger = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ledger.jsonl")
mine = {{"trial": nni.get_trial_id(), "pid": os.getpid()}}
for step in range({steps} if nni.get_sequence_id() == 0 else 1):
    nni.report_intermediate_result(step)
    with open(ledger, "a") as f:
        f.write(json.dumps({{**mine, "step": step}}) + "\\n")
    time.sleep(0.3)
nni.report_final_result(p["x"])
with open(ledger, "a") as f:
    f.write(json.dumps({{**mine, "final": p["x"]}}) + "\\n")
"""


@SERVER
@pytest.mark.parametrize("case", ["resumed", "ended-meanwhile", "stopped-offline"])
def test_a_stop_a_killed_controller_left_unfinished_is_finished_later(tmp_path, prefect_server, case):
    """A controller records a trial's stop, then dies before its kill (SIGKILL between the two): the trial
    runs on and reports results nobody reads. The resumed controller kills it, takes in every result it
    reported, and settles the stop -- to the trial's own outcome when it had ended by itself meanwhile;
    ``trialflow stop`` without a controller kills it too. Neither the process nor the mark outlives either."""
    import os

    from tests.conftest import run_until_running_then_sigkill, start_controller, wait_for
    from trialflow import parse_config
    from trialflow.app.control import stop_experiment

    ended_by_itself = case == "ended-meanwhile"
    write_trial(tmp_path / "code", REPORTING.format(steps=8 if ended_by_itself else 200))
    config = parse_config(base_config(tmp_path / "code", tmp_path / "w", trialConcurrency=1, maxTrialNumber=2))
    exp_id, exp_dir, store = run_until_running_then_sigkill(config, prefect_server, running=1)
    ledger = tmp_path / "code" / "ledger.jsonl"
    trial = store.trials()[0]

    def reported() -> list[dict]:  # by the first trial
        lines = ledger.read_text().splitlines() if ledger.exists() else []
        return [e for e in map(json.loads, lines) if e["trial"] == trial.id]

    assert store.record_stop(trial.id, "USER_CANCELED", "cancelled by the user")  # what the killed controller did
    assert store.trial(trial.id).stopping
    seen = len(reported())
    wait_for(lambda: any("final" in e for e in reported()) if ended_by_itself else len(reported()) >= seen + 2,
             timeout=60)  # results reported after the stop was recorded
    if case == "stopped-offline":
        assert stop_experiment(store, exp_dir.parent, wait=0) == []
    else:
        with open(tmp_path / "resumed.log", "w") as output:
            second = start_controller(exp_id, exp_dir.parent, prefect_server, output)
            assert second.wait(timeout=180) == 0, (tmp_path / "resumed.log").read_text()
        assert store.experiment().status == "DONE"
    done = store.trial(trial.id)
    assert (done.status, done.stopping) == ("SUCCEEDED" if ended_by_itself else "USER_CANCELED", False), done
    if ended_by_itself:
        assert done.final == trial.parameters["x"] and done.exit_code == 0
    else:
        pid = reported()[0]["pid"]
        wait_for(lambda: not os.path.exists(f"/proc/{pid}"), timeout=30)  # killed: it would report for a minute
        assert done.message == "cancelled by the user"
    if case != "stopped-offline":  # the resumed controller took in every result the trial reported
        stored = {int(m.sequence): m.value for m in store.metrics(trial.id, "PERIODICAL")}
        steps = [e["step"] for e in reported() if "step" in e]
        assert all(stored.get(step) == step for step in steps), (stored, steps)
