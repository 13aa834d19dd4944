"""Hybrid experiments (a trainingService list): local + remote (real sshd) + Kubeflow (API emulator)
in one experiment, per-service overrides, placement, SIGKILL + resume on every service, and a
service that goes away mid-run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter

import pytest

import trialflow
from tests.conftest import base_config, k8s_section, machine, run_in_thread, start_controller, wait_for, write_trial
from tests.test_remote_experiment import TRIAL, _events, _peak
from trialflow import parse_config, run_experiment
from trialflow.experiments import create_experiment, open_store
from trialflow.platforms import service_name

pytestmark = pytest.mark.usefixtures("prefect_server")

SERVICES = ("local", "remote", "kubeflow")


def hybrid_config(tmp_path, servers, known_hosts, nfs_dir, sleep=0.3, reuse=False, **overrides) -> dict:
    write_trial(tmp_path / "code", TRIAL.format(log=str(tmp_path / "events.jsonl"), sleep=sleep))
    local = {"platform": "local", "trialCommand": "python3 trial.py local"}
    remote = {"platform": "remote", "knownHostsFile": str(known_hosts), "trialCommand": "python3 trial.py remote",
              "machineList": [machine(s, tmp_path / f"remote{i}") for i, s in enumerate(servers)], "reuseMode": reuse}
    kube = {**k8s_section("tfjob", nfs_dir, reuse, command="python3 trial.py kubeflow"),
            "trialCommand": "python3 trial.py kubeflow"}
    services = overrides.pop("services", [local, remote, kube])
    return base_config(tmp_path / "code", tmp_path / "w", trialCommand="python3 trial.py top",
                       trainingService=services, **overrides)


def _check_all_ran_once(tmp_path, store, trials, count):
    assert len(trials) == count and all(t.status == "SUCCEEDED" for t in trials), \
        [(t.id, t.status, t.message) for t in trials]
    for trial in trials:
        assert [m.value for m in store.metrics(trial.id, "PERIODICAL")] == [
            pytest.approx(trial.parameters["x"] + i) for i in range(3)]
        assert trial.final == pytest.approx(trial.parameters["x"] * 10)
    starts = [e for e in _events(tmp_path) if e["kind"] == "start"]
    assert sorted(e["trial"] for e in starts) == sorted(t.id for t in trials), "a trial ran twice or not at all"
    via = {e["trial"]: e["via"] for e in starts}
    for trial in trials:  # each ran with its own service's trialCommand, and its record says which
        assert via[trial.id] == service_name(trial.handle), (trial.id, via[trial.id], trial.handle)


@pytest.mark.parametrize("reuse", [False, True], ids=["per-trial", "reuse"])
def test_local_remote_and_kubeflow_in_one_experiment(tmp_path, sshd_servers, known_hosts, k8s, prefect_server,
                                                     reuse):
    config = hybrid_config(tmp_path, sshd_servers[:1], known_hosts, k8s.nfs_dir, reuse=reuse, trialConcurrency=6,
                           maxTrialNumber=15)
    result = run_experiment(config)
    assert result.status == "DONE"
    store = open_store(tmp_path / "w", result.experiment_id)
    _check_all_ran_once(tmp_path, store, result.trials, 15)
    per_service = Counter(service_name(t.handle) for t in result.trials)
    assert set(per_service) == set(SERVICES)
    # every service took trials; how many each took follows how fast it frees slots (the placement rule
    # itself is checked without timing in tests/platforms/test_hybrid_placement.py)
    assert _peak(_events(tmp_path)) <= 6

    env = {**os.environ, "PREFECT_API_URL": prefect_server}
    cli = [sys.executable, "-m", "trialflow.cli"]
    view = subprocess.run([*cli, "view", result.experiment_id, "--root", str(tmp_path / "w")], capture_output=True,
                          text=True, env=env, timeout=120)
    for name, n in per_service.items():
        assert f"on {name}: {n}  SUCCEEDED {n}" in view.stdout, view.stdout
    listing = subprocess.run([*cli, "trial", "ls", result.experiment_id, "--root", str(tmp_path / "w")],
                             capture_output=True, text=True, env=env, timeout=120)
    assert "service" in listing.stdout and all(name in listing.stdout for name in SERVICES)
    export = tmp_path / "export.json"
    subprocess.run([*cli, "experiment", "export", result.experiment_id, "-t", "json", "-f", str(export), "--root",
                    str(tmp_path / "w")], check=True, env=env, timeout=120, capture_output=True)
    assert Counter(row["trainingService"] for row in json.loads(export.read_text())) == per_service
    remote_trial = next(t for t in result.trials if service_name(t.handle) == "remote")
    logs = subprocess.run([*cli, "log", "trial", result.experiment_id, remote_trial.id, "--root",
                           str(tmp_path / "w")], capture_output=True, text=True, env=env, timeout=120)
    assert logs.returncode == 0 and "trial.stdout" in logs.stdout, logs.stdout + logs.stderr
    if reuse:  # each service kept its own warm workers: a reuse environment per service, none per trial
        assert (tmp_path / "remote0" / result.experiment_id / "env-0").is_dir()
        envs = list((k8s.nfs_dir / "nni" / result.experiment_id / "envs").iterdir())
        assert 1 <= len(envs) < per_service["kubeflow"]


def test_max_concurrency_and_weight_place_trials(tmp_path, sshd_servers, known_hosts, k8s):
    local = {"platform": "local", "trialCommand": "python3 trial.py local", "maxConcurrency": 1}
    remote = {"platform": "remote", "knownHostsFile": str(known_hosts), "trialCommand": "python3 trial.py remote",
              "machineList": [machine(sshd_servers[0], tmp_path / "remote0")], "maxConcurrency": 3, "weight": 2}
    config = hybrid_config(tmp_path, sshd_servers[:1], known_hosts, k8s.nfs_dir, trialConcurrency=8,
                           maxTrialNumber=8, services=[local, remote])
    result = run_experiment(config)
    store = open_store(tmp_path / "w", result.experiment_id)
    _check_all_ran_once(tmp_path, store, result.trials, 8)
    events = _events(tmp_path)
    for name, cap in (("local", 1), ("remote", 3)):  # the window is the caps' sum (4), not 8
        assert _peak([e for e in events if e["via"] == name]) <= cap
    assert _peak(events) <= 4
    per_service = Counter(service_name(t.handle) for t in result.trials)
    assert per_service["remote"] > per_service["local"]


def test_a_raised_concurrency_reaches_members_without_max_concurrency(tmp_path, prefect_server):
    write_trial(tmp_path / "code", TRIAL.format(log=str(tmp_path / "events.jsonl"), sleep=1.0))
    services = [{"platform": "local", "trialCommand": f"python3 trial.py {name}"} for name in ("local", "local#2")]
    config = base_config(tmp_path / "code", tmp_path / "w", trialConcurrency=1, maxTrialNumber=8,
                         trainingService=services)
    exp_id, exp_dir = create_experiment(parse_config(config), None)
    store = open_store(exp_dir.parent, exp_id)
    controller = start_controller(exp_id, exp_dir.parent, prefect_server)
    wait_for(lambda: store.trials(["RUNNING"]), timeout=120)
    assert trialflow.update_experiment(exp_id, "concurrency", 4, root=exp_dir.parent) == 4
    assert controller.wait(timeout=240) == 0
    _check_all_ran_once(tmp_path, store, store.trials(), 8)  # none failed as "every service is full"
    assert _peak(_events(tmp_path)) >= 3  # more than the two members' first caps of 1 together


def test_sigkill_and_resume_reattach_trials_on_every_service(tmp_path, sshd_servers, known_hosts, k8s, prefect_server):
    config = hybrid_config(tmp_path, sshd_servers[:1], known_hosts, k8s.nfs_dir, sleep=1.5, reuse=True,
                           trialConcurrency=3, maxTrialNumber=6)
    for section in config["trainingService"]:
        section["maxConcurrency"] = 1  # one running trial on each service at the kill
    exp_id, exp_dir = create_experiment(parse_config(config), None)
    store = open_store(exp_dir.parent, exp_id)
    controller = start_controller(exp_id, exp_dir.parent, prefect_server)
    running = wait_for(lambda: (r := store.trials(["RUNNING"])) and len(r) == 3 and r, timeout=180)
    assert {service_name(t.handle) for t in running} == set(SERVICES)
    os.kill(controller.pid, signal.SIGKILL)
    controller.wait()
    second = start_controller(exp_id, exp_dir.parent, prefect_server)
    assert second.wait(timeout=240) == 0
    assert store.experiment().status == "DONE"
    _check_all_ran_once(tmp_path, store, store.trials(), 6)
    for trial in running:  # re-attached where they ran, not started again
        assert service_name(store.trial(trial.id).handle) == service_name(trial.handle)


def test_a_service_going_away_mid_run_leaves_the_others_running(tmp_path, k8s):
    from trialflow.testing.sshd import LoopbackSshd

    with LoopbackSshd(tmp_path / "sshd") as server:
        known = tmp_path / "known_hosts"
        known.write_text(server.known_hosts.read_text())
        local = {"platform": "local", "trialCommand": "python3 trial.py local", "maxConcurrency": 2}
        remote = {"platform": "remote", "knownHostsFile": str(known), "trialCommand": "python3 trial.py remote",
                  "machineList": [machine(server, tmp_path / "remote0")], "maxConcurrency": 2}
        config = hybrid_config(tmp_path, [server], known, k8s.nfs_dir, sleep=0.4, trialConcurrency=4,
                               maxTrialNumber=16, services=[local, remote])
        runner, outcome = run_in_thread(lambda: run_experiment(config))
        wait_for(lambda: any(e["via"] == "remote" and e["kind"] == "start" for e in _events(tmp_path)), timeout=120)
        server.drop_connections()
        server.stop(remove=False)  # the machine is unreachable: connections cut, nothing listens
        ended_before = sum(e["kind"] == "end" and e["via"] == "local" for e in _events(tmp_path))
        wait_for(lambda: sum(e["kind"] == "end" and e["via"] == "local" for e in _events(tmp_path))
                 >= ended_before + 4, timeout=120)  # local trials go on while remote is away
        server.start(server.port)
        runner.join(timeout=300)
    result = outcome["result"]
    assert result.status == "DONE"
    store = open_store(tmp_path / "w", result.experiment_id)
    _check_all_ran_once(tmp_path, store, result.trials, 16)


def test_a_service_that_cannot_start_fails_the_experiment_naming_it(tmp_path, known_hosts, k8s):
    from trialflow.testing.ports import free_port

    dead = {"host": "127.0.0.1", "port": free_port(), "user": "nobody", "password": "pw-123456"}
    remote = {"platform": "remote", "knownHostsFile": str(known_hosts), "trialCommand": "python3 trial.py remote",
              "machineList": [dead]}
    config = hybrid_config(tmp_path, [], known_hosts, k8s.nfs_dir,
                           services=[{"platform": "local", "trialCommand": "python3 trial.py local"}, remote])
    with pytest.raises(Exception, match=r"training service remote \(trainingService\[1\]\) cannot start") as err:
        run_experiment(config)
    assert "pw-123456" not in str(err.value)
    (exp_dir,) = [p for p in (tmp_path / "w").iterdir() if (p / "db").is_dir()]
    store = open_store(tmp_path / "w", exp_dir.name)
    assert store.experiment().status == "ERROR" and "trainingService[1]" in store.experiment().message
    assert store.count_trials() == 0


def test_a_trial_lost_on_a_service_gives_its_slot_back(tmp_path, sshd_servers, known_hosts, k8s):
    """The first trial removes its own directory: its service loses track of it (FAILED, lost
    handle). That service's one slot must come back, or every later trial goes elsewhere."""
    # (it then ends: its parameters went with its directory, and a run left waiting for them would outlive the test)
    lose_first = ("import os, shutil, nni\nif nni.get_sequence_id() == 0:\n"
                  "    shutil.rmtree(os.environ['NNI_SYS_DIR'])\n    import time; time.sleep(2)\n"
                  "    raise SystemExit(0)\n")
    services = [{"platform": "local", "trialCommand": "python3 trial.py local", "maxConcurrency": 1},
                {"platform": "local", "trialCommand": "python3 trial.py local#2", "maxConcurrency": 1}]
    config = hybrid_config(tmp_path, [], known_hosts, k8s.nfs_dir, sleep=0.2, trialConcurrency=2, maxTrialNumber=8,
                           services=services)
    trial = tmp_path / "code" / "trial.py"
    trial.write_text(lose_first + trial.read_text())
    result = run_experiment(config)
    assert result.status == "DONE"
    lost = [t for t in result.trials if t.sequence == 0]
    assert lost[0].status == "FAILED" and service_name(lost[0].handle) == "local"
    assert all(t.status == "SUCCEEDED" for t in result.trials if t.sequence != 0)
    assert sum(service_name(t.handle) == "local" for t in result.trials) > 1
