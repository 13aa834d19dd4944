"""Experiments on a real Slurm cluster end to end (the test cluster on 127.0.0.1): NNI trial code in a
hybrid local + Slurm experiment with reuse, Slurm's own events (scancel from outside, a time limit,
a requeue) in one experiment, and a SIGKILLed controller resumed over the SSH route."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import (
    base_config,
    run_in_thread,
    run_until_running_then_sigkill,
    slurm_section,
    start_controller,
    wait_for,
    write_trial,
)
from trialflow import parse_config, run_experiment
from trialflow.experiments import open_store
from trialflow.platforms import service_name
from trialflow.platforms.slurm import SlurmTrainingService

pytestmark = pytest.mark.usefixtures("prefect_server")

# NNI trial code; each start and end is appended to a file the test reads ("mode" picks a behaviour).
# Trials on the local service take {local_sleep} per step, so that in a hybrid experiment a fast local slot
# cannot take nearly every trial while Slurm's environments are still starting.
TRIAL = """
import fcntl, json, os, time, nni
p = nni.get_next_parameter()
def mark(kind):
    with open({log!r}, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(json.dumps({{"trial": nni.get_trial_id(), "kind": kind, "mode": p.get("mode"),
                            "platform": os.environ["NNI_PLATFORM"], "sys_dir": os.environ["NNI_SYS_DIR"]}}) + "\\n")
mark("start")
again = os.path.join(os.environ["NNI_SYS_DIR"], "ran-before")
rerun = os.path.exists(again)
open(again, "a").close()
for i in range(3):
    nni.report_intermediate_result(p.get("x", 0) + i)
    time.sleep({local_sleep} if os.environ["NNI_PLATFORM"] == "local" else {sleep})
if p.get("mode") in ("scancel", "timeout") or (p.get("mode") == "requeue" and not rerun):
    time.sleep(600)
nni.report_final_result(p.get("x", 0) * 10)
mark("end")
"""


def slurm_experiment(tmp_path: Path, cluster, sleep: float = 0.1, server=None, service=None, local_sleep: float = 1.0,
                     **overrides) -> dict:
    write_trial(tmp_path / "code", TRIAL.format(log=str(tmp_path / "events.jsonl"), sleep=sleep,
                                                local_sleep=local_sleep))
    section = slurm_section(cluster, tmp_path / "cluster", server, **(service or {}))
    return base_config(tmp_path / "code", tmp_path / "w", trialCommand="python3 trial.py", trainingService=section,
                       **overrides)


def _events(tmp_path: Path) -> list[dict]:
    path = tmp_path / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _starts(tmp_path: Path) -> Counter:
    return Counter(e["trial"] for e in _events(tmp_path) if e["kind"] == "start")


def test_nni_trials_on_local_and_slurm_with_reuse_in_one_experiment(tmp_path, slurm_cluster, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    config = slurm_experiment(tmp_path, slurm_cluster, trialConcurrency=4, maxTrialNumber=10,
                              service={"reuseMode": True})
    config["trainingService"] = [{"platform": "local", "maxConcurrency": 1}, config["trainingService"]]
    users = tmp_path / "cluster" / "study" / "trials" / "p.csv"  # the user's own, beside trialflow's folders
    users.parent.mkdir(parents=True)
    users.write_text("mine")
    result = run_experiment(config)
    assert result.status == "DONE"
    assert [(t.status, t.message) for t in result.trials if t.status != "SUCCEEDED"] == []
    store = open_store(tmp_path / "w", result.experiment_id)
    for trial in result.trials:  # each trial's metrics come from its own parameters
        assert [m.value for m in store.metrics(trial.id, "PERIODICAL")] == [
            pytest.approx(trial.parameters["x"] + i) for i in range(3)]
        assert trial.final == pytest.approx(trial.parameters["x"] * 10)
    assert _starts(tmp_path) == Counter(t.id for t in result.trials)  # each ran once
    per_service = Counter(service_name(t.handle) for t in result.trials)
    assert set(per_service) == {"local", "slurm"}
    on_slurm = [e for e in _events(tmp_path) if e["platform"] == "slurm" and e["kind"] == "start"]
    assert len(on_slurm) == per_service["slurm"]
    envs = {t.handle["data"]["env"] for t in result.trials if service_name(t.handle) == "slurm"}
    assert 1 <= len(envs) < per_service["slurm"]  # reuse: environments hosted several trials each
    assert slurm_cluster.jobs() == [] or all(  # the environments left with the experiment
        state in ("COMPLETED", "CANCELLED") for state in slurm_cluster.run(
            "squeue", "-h", "-t", "all", "-o", "%T", "--name", ",".join(
                t.handle["data"]["job"] for t in result.trials if service_name(t.handle) == "slurm")).split())

    # platform clean on the login node: the code bundles, the runtime and the experiment's folder, nothing else
    slurm = SlurmTrainingService(parse_config(config).services[1], tmp_path / "w" / result.experiment_id)
    made = sorted(p.rsplit(":", 1)[-1] for p in slurm.clean(dry_run=True))
    assert made == [str(tmp_path / "cluster" / name) for name in sorted(("code", "runtime", result.experiment_id))]
    assert slurm.clean() == [f"this machine:{path}" for path in made]
    assert [p.name for p in (tmp_path / "cluster").iterdir()] == ["study"] and users.read_text() == "mine"


def test_scancel_time_limit_and_requeue_are_told_apart(tmp_path, slurm_cluster, monkeypatch):
    """One experiment, four trials at once: one finishes; one is cancelled with scancel from outside
    (SYS_CANCELED); one runs past timeLimit (FAILED, naming the limit); one is requeued with
    scontrol while it runs (resubmitted with the same parameters, SUCCEEDED, not counted failed)."""
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    modes = ["ok", "scancel", "timeout", "requeue"]
    config = slurm_experiment(tmp_path, slurm_cluster, trialConcurrency=4, maxTrialNumber=4,
                              searchSpace={"mode": {"_type": "choice", "_value": modes}},
                              tuner={"name": "GridSearch"}, service={"timeLimit": "1"})
    runner, outcome = run_in_thread(lambda: run_experiment(config))
    started = wait_for(lambda: (lambda e: e if len(e) == 4 else None)(
        {e["mode"]: e for e in _events(tmp_path) if e["kind"] == "start"}), timeout=120)
    jobs = dict(line.split() for line in slurm_cluster.run("squeue", "-h", "-o", "%j %i").splitlines())

    def job_of(mode: str) -> str:
        return next(jid for name, jid in jobs.items() if name.endswith("-" + started[mode]["trial"]))

    slurm_cluster.run("scancel", job_of("scancel"))
    slurm_cluster.run("scontrol", "requeue", job_of("requeue"))
    runner.join(timeout=240)
    result = outcome["result"]
    assert result.status == "DONE"
    by_mode = {t.parameters["mode"]: t for t in result.trials}
    assert by_mode["ok"].status == "SUCCEEDED"
    assert by_mode["scancel"].status == "SYS_CANCELED" and "cancelled outside trialflow" in by_mode["scancel"].message
    assert by_mode["timeout"].status == "FAILED" and "time limit (timeLimit: 1)" in by_mode["timeout"].message
    requeued = by_mode["requeue"]
    assert requeued.status == "SUCCEEDED" and requeued.final == 0, requeued.message
    assert requeued.handle["data"]["attempt"] == 1 and requeued.handle["data"]["job"].endswith("-r1")
    assert _starts(tmp_path)[requeued.id] == 2  # the interrupted run, then the resubmitted one
    store = open_store(tmp_path / "w", result.experiment_id)
    assert len(store.metrics(requeued.id, "FINAL")) == 1
    assert [t.id for t in result.trials if t.status == "FAILED"] == [by_mode["timeout"].id]


def test_controller_sigkill_and_resume_over_ssh_reattach_running_jobs(tmp_path, slurm_cluster, sshd_servers,
                                                                      known_hosts, prefect_server):
    """Over the SSH route with reuse: the resumed controller re-attaches the trials running in the
    environments the first one started, and takes new trials in them."""
    config = slurm_experiment(tmp_path, slurm_cluster, sleep=1.0, server=sshd_servers[0], trialConcurrency=2,
                              maxTrialNumber=4, service={"knownHostsFile": str(known_hosts), "reuseMode": True})
    exp_id, exp_dir, store = run_until_running_then_sigkill(parse_config(config), prefect_server)
    assert store.trials(["RUNNING"])
    second = start_controller(exp_id, exp_dir.parent, prefect_server)
    assert second.wait(timeout=180) == 0
    trials = store.trials()
    assert store.experiment().status == "DONE"
    assert len(trials) == 4 and all(t.status == "SUCCEEDED" for t in trials)
    assert _starts(tmp_path) == Counter(t.id for t in trials), "a Slurm trial ran twice or not at all"
    for trial in trials:
        assert len(store.metrics(trial.id, "PERIODICAL")) == 3 and len(store.metrics(trial.id, "FINAL")) == 1
    assert len({t.handle["data"]["env"] for t in trials}) < 4  # environments hosted several trials
