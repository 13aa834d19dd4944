"""Experiments on the remote service end to end: two loopback sshd machines, Prefect test server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import (
    base_config,
    machine,
    run_in_thread,
    run_until_running_then_sigkill,
    start_controller,
    wait_for,
    write_trial,
)
from trialflow import parse_config, run_experiment
from trialflow.experiments import open_store

pytestmark = pytest.mark.usefixtures("prefect_server")

# Each start is appended to a file on this machine (the "remote" machines are loopback); "via" is the
# command's first argument (hybrid experiments name the service there).
TRIAL = """
import fcntl, json, os, sys, time, nni
p = nni.get_next_parameter()
def mark(kind):
    with open({log!r}, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(json.dumps({{"trial": nni.get_trial_id(), "kind": kind, "t": time.time(),
                            "sys_dir": os.environ["NNI_SYS_DIR"], "via": (sys.argv[1:] or [None])[0]}}) + "\\n")
mark("start")
for i in range(3):
    nni.report_intermediate_result(p["x"] + i)
    time.sleep({sleep})
nni.report_final_result(p["x"] * 10)
mark("end")
"""


def remote_experiment(tmp_path: Path, servers, known_hosts: Path, sleep: float = 0.1, **overrides) -> dict:
    log = tmp_path / "events.jsonl"
    write_trial(tmp_path / "code", TRIAL.format(log=str(log), sleep=sleep))
    service = {"platform": "remote", "knownHostsFile": str(known_hosts),
               "machineList": [machine(s, tmp_path / f"remote{i}") for i, s in enumerate(servers)]}
    service.update(overrides.pop("service", {}))
    config = base_config(tmp_path / "code", tmp_path / "w", trialCommand="python3 trial.py",
                         trainingService=service, **overrides)
    return config


def _events(tmp_path: Path) -> list[dict]:
    path = tmp_path / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _peak(events: list[dict]) -> int:
    live = peak = 0
    for e in sorted(events, key=lambda e: (e["t"], e["kind"] == "start")):
        live += 1 if e["kind"] == "start" else -1
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize("reuse", [False, True], ids=["per-trial-ssh", "reuse"])
def test_twelve_trials_on_two_machines_at_concurrency_four(tmp_path, sshd_servers, known_hosts, reuse):
    config = remote_experiment(tmp_path, sshd_servers, known_hosts, sleep=0.2, trialConcurrency=4,
                               maxTrialNumber=12, service={"reuseMode": reuse})
    result = run_experiment(config)
    assert result.status == "DONE"
    assert len(result.trials) == 12 and all(t.status == "SUCCEEDED" for t in result.trials)
    store = open_store(tmp_path / "w", result.experiment_id)
    for trial in result.trials:
        assert [m.value for m in store.metrics(trial.id, "PERIODICAL")] == [
            pytest.approx(trial.parameters["x"] + i) for i in range(3)]
        assert trial.final == pytest.approx(trial.parameters["x"] * 10)
    events = _events(tmp_path)
    starts = [e for e in events if e["kind"] == "start"]
    assert sorted(e["trial"] for e in starts) == sorted(t.id for t in result.trials)  # each ran once
    machines_used = {Path(e["sys_dir"]).parents[2].name for e in starts}
    assert machines_used == {"remote0", "remote1"}
    assert _peak(events) <= 4


def test_dropped_connections_and_an_sshd_restart_lose_nothing(tmp_path, sshd_servers, known_hosts):
    config = remote_experiment(tmp_path, sshd_servers, known_hosts, sleep=0.7, trialConcurrency=4,
                               maxTrialNumber=8)
    runner, outcome = run_in_thread(lambda: run_experiment(config))
    wait_for(lambda: len([e for e in _events(tmp_path) if e["kind"] == "start"]) >= 3)
    sshd_servers[0].drop_connections()
    sshd_servers[1].restart()  # listener down and up again; its sessions killed as well
    sshd_servers[1].drop_connections()
    runner.join(timeout=240)
    result = outcome["result"]
    assert result.status == "DONE"
    assert [(t.status, t.message) for t in result.trials if t.status != "SUCCEEDED"] == []
    store = open_store(tmp_path / "w", result.experiment_id)
    for trial in result.trials:
        assert len(store.metrics(trial.id, "PERIODICAL")) == 3 and len(store.metrics(trial.id, "FINAL")) == 1
    assert sorted(e["trial"] for e in _events(tmp_path) if e["kind"] == "start") == sorted(
        t.id for t in result.trials)


def _two_running_then_sigkill(tmp_path, servers, known_hosts, api_url, **overrides):
    """Start the experiment in its own controller process, SIGKILL it once two trials run."""
    config = parse_config(remote_experiment(tmp_path, servers, known_hosts, trialConcurrency=2, **overrides))
    return run_until_running_then_sigkill(config, api_url)


@pytest.mark.parametrize("reuse", [False, True], ids=["per-trial-ssh", "reuse"])
def test_controller_sigkill_and_resume_reattaches_remote_trials(tmp_path, sshd_servers, known_hosts, prefect_server,
                                                                reuse):
    exp_id, exp_dir, store = _two_running_then_sigkill(tmp_path, sshd_servers, known_hosts, prefect_server, sleep=1.0,
                                                       maxTrialNumber=4, service={"reuseMode": reuse})
    running = {t.id for t in store.trials(["RUNNING"])}
    assert running
    second = start_controller(exp_id, exp_dir.parent, prefect_server)
    assert second.wait(timeout=180) == 0
    trials = store.trials()
    assert store.experiment().status == "DONE"
    assert len(trials) == 4 and all(t.status == "SUCCEEDED" for t in trials)
    starts = [e["trial"] for e in _events(tmp_path) if e["kind"] == "start"]
    assert sorted(starts) == sorted(t.id for t in trials), "a remote trial ran twice or not at all"
    for trial in trials:
        assert len(store.metrics(trial.id, "PERIODICAL")) == 3 and len(store.metrics(trial.id, "FINAL")) == 1


def test_wrong_password_fails_at_start_before_any_trial(tmp_path, sshd_servers, known_hosts):
    config = remote_experiment(tmp_path, sshd_servers[:1], known_hosts)
    entry = config["trainingService"]["machineList"][0]
    entry.pop("sshKeyFile")
    entry["password"] = "not-the-password-123"
    with pytest.raises(Exception, match="SSH authentication failed with the password") as err:
        run_experiment(config)
    assert "not-the-password-123" not in str(err.value)
    root = tmp_path / "w"
    (exp_id,) = [p.name for p in root.iterdir() if (p / "db").is_dir()]
    store = open_store(root, exp_id)
    assert store.experiment().status == "ERROR" and store.count_trials() == 0


def test_credentials_from_a_prefect_block(tmp_path, sshd_servers, known_hosts):
    from trialflow.blocks.remote import SSHCredentials

    server = sshd_servers[1]
    SSHCredentials(username=server.user, private_key=server.key_file.read_text()).save("loopback-ssh", overwrite=True)
    config = remote_experiment(tmp_path, [server], known_hosts, maxTrialNumber=2)
    entry = config["trainingService"]["machineList"][0]
    for key in ("user", "sshKeyFile"):
        entry.pop(key)
    entry["credentials"] = "loopback-ssh"
    result = run_experiment(config)
    assert result.status == "DONE" and [t.status for t in result.trials] == ["SUCCEEDED", "SUCCEEDED"]


def test_log_trial_fetches_remote_logs(tmp_path, sshd_servers, known_hosts, prefect_server):
    config = remote_experiment(tmp_path, sshd_servers[:1], known_hosts, maxTrialNumber=1)
    config["trialCommand"] = "python3 trial.py && echo remote-stdout-marker"
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(config))
    result = run_experiment(str(path))
    trial = result.trials[0]
    env = {**os.environ, "PREFECT_API_URL": prefect_server}
    proc = subprocess.run([sys.executable, "-m", "trialflow.cli", "log", "trial", result.experiment_id, trial.id,
                           "--root", str(tmp_path / "w")], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "remote-stdout-marker" in proc.stdout and "trial.stdout" in proc.stdout
    assert (tmp_path / "w" / result.experiment_id / "trials" / trial.id / "trial.stdout").is_file()

    # nnictl platform clean: what trialflow left on the machine goes, the experiment here stays
    remote_root = tmp_path / "remote0"
    assert (remote_root / "code").is_dir() and (remote_root / result.experiment_id / "trials").is_dir()
    (remote_root / "users-file").write_text("not trialflow's")
    clean = subprocess.run([sys.executable, "-m", "trialflow.cli", "platform", "clean", "--config", str(path), "--yes"],
                           capture_output=True, text=True, env=env, timeout=120)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert str(remote_root) in clean.stdout
    assert sorted(p.name for p in remote_root.iterdir()) == ["users-file"]
    assert (tmp_path / "w" / result.experiment_id / "trials" / trial.id / "trial.stdout").is_file()


def test_stop_without_a_controller_kills_remote_trials(tmp_path, sshd_servers, known_hosts, prefect_server):
    exp_id, exp_dir, store = _two_running_then_sigkill(tmp_path, sshd_servers, known_hosts, prefect_server,
                                                       sleep=20.0, maxTrialNumber=2)
    pids = []
    for trial in store.trials():
        keeper = json.loads((Path(trial.handle["data"]["trial_dir"]) / ".nni" / "keeper.pid").read_text())
        pids.append(keeper["pid"])
    env = {**os.environ, "PREFECT_API_URL": prefect_server}
    proc = subprocess.run([sys.executable, "-m", "trialflow.cli", "stop", exp_id, "--root", str(exp_dir.parent),
                           "--wait", "1"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert store.experiment().status == "STOPPED"
    assert {t.status for t in store.trials()} == {"USER_CANCELED"}
    from trialflow.trial.procs import group_alive

    wait_for(lambda: not any(group_alive(pid) for pid in pids), timeout=15)
    assert not [e for e in _events(tmp_path) if e["kind"] == "end"]


def test_the_config_file_and_files_holding_its_secrets_stay_out_of_the_uploaded_code(tmp_path, sshd_servers,
                                                                                     known_hosts):
    """The quickstart's layout: the config sits in the code folder, with a secret inline."""
    config = remote_experiment(tmp_path, sshd_servers[:1], known_hosts, maxTrialNumber=1)
    config["trainingService"]["machineList"][0]["sshPassphrase"] = "passphrase-4242"  # the key has none: unused
    path = tmp_path / "code" / "config.yml"
    path.write_text(yaml.safe_dump(config))
    (tmp_path / "code" / "notes.txt").write_text("the passphrase is passphrase-4242\n")
    (tmp_path / "code" / "data.txt").write_text("nothing secret\n")
    result = run_experiment(str(path))
    assert result.status == "DONE"
    [uploaded] = [p for p in (tmp_path / "remote0" / "code").iterdir() if p.is_dir()]
    assert sorted(p.name for p in uploaded.iterdir()) == ["data.txt", "trial.py"]
    log = (tmp_path / "w" / result.experiment_id / "log" / "experiment.log").read_text()
    assert f"{path} is left out of the code the trials get: it is the experiment's config file" in log
    assert "notes.txt is left out of the code the trials get: it holds one of the experiment's secrets" in log
    assert "passphrase-4242" not in log


def test_platform_clean_lists_first_and_removes_only_what_trialflow_made(tmp_path, sshd_servers, known_hosts,
                                                                        prefect_server):
    """A remoteWorkingDirectory shared with the user's own folders (named like trialflow's, holding
    `trials` or `env-*`) and links to folders elsewhere."""
    root, outside = tmp_path / "remote0", tmp_path / "outside"
    users = {"code/myproject/a.py": "mine", "clinical/trials/p.csv": "mine", "webapp/env-production/s": "mine",
             "zzzz9999/notes": "mine"}
    for rel, text in users.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    outside.mkdir()
    (outside / ".trialflow-made").write_text("crafted")
    (outside / "keep.txt").write_text("not trialflow's")
    (root / "abcd1234").symlink_to(outside, target_is_directory=True)
    (root / "runtime").symlink_to(outside, target_is_directory=True)
    config = remote_experiment(tmp_path, sshd_servers[:1], known_hosts, maxTrialNumber=1)
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "PREFECT_API_URL": prefect_server}
    result = run_experiment(str(path))  # the runtime goes where the user's `runtime` link points
    assert result.status == "DONE"

    def clean(*flags: str, answer: str = "") -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "trialflow.cli", "platform", "clean", "--config", str(path),
                               *flags], input=answer, capture_output=True, text=True, env=env, timeout=120)

    mine = sorted(str(p.relative_to(root)) for p in root.rglob("*") if not p.is_relative_to(root / "code"))
    declined = clean(answer="n\n")
    listed = [line.rsplit(":", 1)[-1].strip() for line in declined.stdout.splitlines() if "trialflow's:" in line]
    assert declined.returncode == 1 and sorted(listed) == sorted(
        str(root / name) for name in (result.experiment_id,)), declined.stdout
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*") if not p.is_relative_to(root / "code")) == mine
    done = clean("--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    for rel, text in users.items():
        assert (root / rel).read_text() == text
    assert (outside / "keep.txt").is_file() and (root / "abcd1234").is_symlink() and (root / "runtime").is_symlink()
    assert not (root / result.experiment_id).exists()
    assert (root / "code" / "myproject" / "a.py").is_file()  # the user's code folder, used but not claimed

    home = {**config, "trainingService": {**config["trainingService"], "machineList": [
        {**config["trainingService"]["machineList"][0], "remoteWorkingDirectory": "~"}]}}
    path.write_text(yaml.safe_dump(home))
    refused = clean("--yes")
    assert refused.returncode == 1 and "is a home folder" in refused.stdout and "Traceback" not in refused.stderr
