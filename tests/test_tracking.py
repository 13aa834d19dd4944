"""Experiments logged to a real MLflow tracking server (``mlflow server`` with basic authentication):
the parent run and one nested run per trial with parameters, intermediate results as steps, final
results, status, times and output; the best trial tagged; on local and on a job platform; a tracker
that is down mid-run and comes back; a resume that logs nothing twice; a login that stays secret."""

from __future__ import annotations

import json
import os
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import base_config, k8s_section, run_in_thread, wait_for, write_trial
from tests.test_cli import cli
from trialflow import run_experiment
from trialflow.experiments import open_store

pytestmark = pytest.mark.usefixtures("prefect_server")

TRIAL = """
import os, sys, time
import nni
p = nni.get_next_parameter()
while p["x"] == HOLD and os.path.exists(GATE):  # held while the test needs the experiment running
    time.sleep(0.1)
while p["x"] in LATER and os.path.exists(OUTAGE):  # held until the test has stopped the tracker
    time.sleep(0.1)
for i in range(3):
    nni.report_intermediate_result({"default": p["x"] + i, "loss": 1.0 / (i + 1)})
    time.sleep(SLEEP)
print("trial says", p["x"])
print("to stderr", file=sys.stderr)
if p["x"] == 9:
    sys.exit(3)
nni.report_final_result(p["x"] * 10)
"""


@pytest.fixture
def login(mlflow_server) -> str:
    """A saved MLflowCredentials block with the server's admin login; its name."""
    from trialflow.blocks import MLflowCredentials

    name = f"mlflow-{uuid.uuid4().hex[:8]}"
    MLflowCredentials(username="admin", password=mlflow_server.password).save(name)
    return name


def trial_body(tmp_path: Path, sleep: float = 0.05, hold: int = -1, later: tuple[int, ...] = ()) -> str:
    """:data:`TRIAL` with its placeholders filled: the trial with value ``hold`` waits while the file
    ``gate`` is in ``tmp_path``, the ones with a value in ``later`` while ``outage`` is."""
    return (TRIAL.replace("SLEEP", str(sleep)).replace("HOLD", str(hold))
            .replace("GATE", repr(str(tmp_path / "gate"))).replace("LATER", repr(tuple(later)))
            .replace("OUTAGE", repr(str(tmp_path / "outage"))))


def _config(tmp_path: Path, server, login: str, values=(1, 2, 9), sleep=0.05, hold=-1, later=(),
            **overrides) -> dict:
    body = trial_body(tmp_path, sleep, hold, later)
    write_trial(tmp_path / "code", body)
    name = f"sweep-{uuid.uuid4().hex[:8]}"
    tracking = {"mlflow": {"trackingUri": server.uri, "experimentName": name, "credentials": login}}
    space = {"x": {"_type": "choice", "_value": list(values)}}
    settings = {"maxTrialNumber": len(values), "trialConcurrency": 2, **overrides}
    return base_config(tmp_path / "code", tmp_path / "w", searchSpace=space, tuner={"name": "GridSearch"},
                       tracking=tracking, **settings)


def _client(server, monkeypatch):
    from mlflow import MlflowClient

    for key, value in server.login.items():
        monkeypatch.setenv(key, value)
    return MlflowClient(tracking_uri=server.uri)


def _runs(client, config: dict) -> list:
    found = client.get_experiment_by_name(config["tracking"]["mlflow"]["experimentName"])
    return client.search_runs([found.experiment_id]) if found else []


def _trial_runs(runs: list) -> dict:
    return {r.data.tags["trialflow.trial_id"]: r for r in runs if r.data.tags.get("trialflow.kind") == "trial"}


def _check_trial_runs(client, runs: list, trials: list) -> None:
    """One finished nested run per trial, with what the record holds."""
    [parent] = [r for r in runs if r.data.tags.get("trialflow.kind") == "experiment"]
    by_trial = _trial_runs(runs)
    assert sorted(by_trial) == sorted(t.id for t in trials) and len(runs) == len(trials) + 1
    for trial in trials:
        run = by_trial[trial.id]
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert run.data.params == {"x": str(trial.parameters["x"])}
        assert run.data.tags["trialflow.status"] == trial.status
        assert run.info.status == {"SUCCEEDED": "FINISHED", "FAILED": "FAILED"}[trial.status]
        history = client.get_metric_history(run.info.run_id, "intermediate/default")
        assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == [
            (i, trial.parameters["x"] + i) for i in range(3)]
        assert len(client.get_metric_history(run.info.run_id, "intermediate/loss")) == 3
        if trial.status == "SUCCEEDED":
            assert run.data.metrics["default"] == trial.parameters["x"] * 10
        else:
            assert "default" not in run.data.metrics and run.data.tags["trialflow.exit_code"] == "3"
        assert run.info.start_time == int(trial.start_time * 1000) and run.info.end_time == int(trial.end_time * 1000)
        with tempfile.TemporaryDirectory() as downloads:  # MLflow's own default folder would stay behind
            folder = Path(client.download_artifacts(run.info.run_id, "logs", downloads))
            assert f"trial says {trial.parameters['x']}" in (folder / "trial.stdout").read_text()
            assert "to stderr" in (folder / "trial.stderr").read_text()


def test_an_experiment_on_local_is_a_parent_run_with_a_nested_run_per_trial(tmp_path, mlflow_server, login,
                                                                           monkeypatch):
    config = _config(tmp_path, mlflow_server, login)
    result = run_experiment(config)
    assert result.status == "DONE" and len(result.trials) == 3
    client = _client(mlflow_server, monkeypatch)
    runs = _runs(client, config)
    _check_trial_runs(client, runs, result.trials)
    [parent] = [r for r in runs if r.data.tags.get("trialflow.kind") == "experiment"]
    assert parent.info.status == "FINISHED" and parent.info.run_name == result.experiment_id
    assert parent.data.tags["trialflow.experiment_id"] == result.experiment_id
    assert parent.data.tags["trialflow.platform"] == "local" and parent.data.tags["trialflow.tuner"] == "GridSearch"
    config_file = Path(client.download_artifacts(parent.info.run_id, "config.json", str(tmp_path)))
    assert json.loads(config_file.read_text())["trialCommand"] == config["trialCommand"]
    best = [i for i, r in _trial_runs(runs).items() if r.data.tags.get("trialflow.best") == "true"]
    assert best == [result.best.id] and parent.data.tags["trialflow.best_trial"] == result.best.id
    # the login is in no file of the experiment, in no artifact, and no worker is left
    exp_dir = tmp_path / "w" / result.experiment_id
    for path in [*exp_dir.rglob("*"), config_file]:
        if path.is_file():
            assert mlflow_server.password.encode() not in path.read_bytes(), path
    assert _workers() == []


def _workers() -> list[int]:
    """This process's tracking workers still running."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if (proc.name.isdigit() and b"trialflow.tracking.worker" in (proc / "cmdline").read_bytes()
                    and f"PPid:\t{os.getpid()}\n" in (proc / "status").read_text()):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def test_a_job_platform_experiment_is_logged_with_its_trials_output(tmp_path, mlflow_server, login, k8s,
                                                                    monkeypatch):
    config = _config(tmp_path, mlflow_server, login,
                     trainingService=k8s_section("tfjob", k8s.nfs_dir, command="python3 trial.py"))
    result = run_experiment(config)
    assert result.status == "DONE"
    client = _client(mlflow_server, monkeypatch)
    runs = _runs(client, config)
    _check_trial_runs(client, runs, result.trials)
    [parent] = [r for r in runs if r.data.tags.get("trialflow.kind") == "experiment"]
    assert parent.data.tags["trialflow.platform"] == "kubeflow"


def _experiment_log(tmp_path: Path, experiment_id: str) -> str:
    return (tmp_path / "w" / experiment_id / "log" / "experiment.log").read_text()


def test_a_tracker_down_mid_run_is_said_once_and_caught_up_when_it_is_back(tmp_path, mlflow_server, login,
                                                                         monkeypatch):
    (tmp_path / "gate").touch()  # the last trial waits for it to go: the experiment outlives the outage
    # the middle trials wait for the outage, so they end while the tracker is down, however fast they run
    (tmp_path / "outage").touch()
    config = _config(tmp_path, mlflow_server, login, values=(1, 2, 3, 4, 5), hold=5, later=(2, 3, 4),
                     trialConcurrency=1)
    client = _client(mlflow_server, monkeypatch)
    thread, outcome = run_in_thread(lambda: run_experiment(config))
    try:
        wait_for(lambda: len(_trial_runs(_runs(client, config))) >= 1, timeout=120, interval=0.2)
        mlflow_server.stop()
        (tmp_path / "outage").unlink()
        store = wait_for(lambda: (found := list((tmp_path / "w").glob("*/log"))) and
                         open_store(tmp_path / "w", found[0].parent.name))
        wait_for(lambda: len([t for t in store.trials() if t.is_terminal]) >= 3, timeout=120, interval=0.2)
    finally:
        mlflow_server.start()
        (tmp_path / "outage").unlink(missing_ok=True)
        (tmp_path / "gate").unlink()
    thread.join(timeout=300)
    result = outcome["result"]
    assert result.status == "DONE" and len(result.trials) == 5
    _check_trial_runs(client, _runs(client, config), result.trials)
    log = _experiment_log(tmp_path, result.experiment_id)
    assert log.count("cannot log this experiment now") == 1, log
    assert log.count("answers again: every ended trial is logged") == 1 and "Traceback" not in log


def test_a_resume_logs_what_is_new_and_what_was_cut_off_and_nothing_twice(tmp_path, mlflow_server, login,
                                                                          monkeypatch):
    config = _config(tmp_path, mlflow_server, login, values=(1, 2, 3, 4), maxTrialNumber=2)
    first = run_experiment(config)
    client = _client(mlflow_server, monkeypatch)
    runs = _trial_runs(_runs(client, config))
    assert len(runs) == 2 and runs[first.best.id].data.tags["trialflow.best"] == "true"
    # what a worker killed while logging a trial leaves: that trial's run still RUNNING, half logged
    cut = next(t for t in first.trials if t.id != first.best.id)
    client.delete_run(runs[cut.id].info.run_id)
    parent = next(r for r in _runs(client, config) if r.data.tags.get("trialflow.kind") == "experiment")
    client.create_run(parent.info.experiment_id, tags={**{k: v for k, v in runs[cut.id].data.tags.items()
                                                           if k.startswith("trialflow.")},
                                                        "mlflow.parentRunId": parent.info.run_id})
    more = cli("resume", first.experiment_id, "--trialnum", "4", "--foreground", "--root", str(tmp_path / "w"))
    assert more.returncode == 0, more.stdout + more.stderr
    trials = open_store(tmp_path / "w", first.experiment_id).trials()
    runs_now = _runs(client, config)
    _check_trial_runs(client, runs_now, trials)  # one run per trial: the cut-off one logged again, once
    best = [i for i, r in _trial_runs(runs_now).items() if r.data.tags.get("trialflow.best") == "true"]
    assert best == [max((t for t in trials if t.status == "SUCCEEDED"), key=lambda t: t.final).id]


def test_a_tracker_that_refuses_the_login_never_fails_the_experiment(tmp_path, mlflow_server, monkeypatch):
    from trialflow.blocks import MLflowCredentials

    wrong = f"mlflow-wrong-{uuid.uuid4().hex[:8]}"
    MLflowCredentials(username="admin", password="not-the-password").save(wrong)
    config = _config(tmp_path, mlflow_server, wrong, values=(1, 2))
    started = time.monotonic()
    result = run_experiment(config)
    assert result.status == "DONE" and [t.status for t in result.trials] == ["SUCCEEDED", "SUCCEEDED"]
    assert time.monotonic() - started < 90  # the end waits a few tries, not the client's minutes of retries
    log = _experiment_log(tmp_path, result.experiment_id)
    assert log.count("cannot log this experiment now") == 1 and "401" in log, log
    assert "not-the-password" not in log and "Traceback" not in log
    assert _runs(_client(mlflow_server, monkeypatch), config) == []
