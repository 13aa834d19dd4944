"""`trialflow tensorboard start|stop`: TensorBoard over the trials' $NNI_OUTPUT_DIR/tensorboard logs,
local and remote (copied over SFTP), on 127.0.0.1."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tests.conftest import base_config, machine, raw_request, wait_for, without_sock_diag, write_trial
from trialflow import run_experiment
from trialflow.testing.ports import free_port

pytestmark = pytest.mark.usefixtures("prefect_server")

# Written with TensorBoard's own event writer: a scalar "loss" = x * step for steps 0..2.
TRIAL = """
import os, time, nni
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter
p = nni.get_next_parameter()
writer = EventFileWriter(os.path.join(os.environ["NNI_OUTPUT_DIR"], "tensorboard"))
for step in range(3):
    value = summary_pb2.Summary.Value(tag="loss", simple_value=p["x"] * step)
    writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=[value])))
writer.close()
nni.report_final_result(p["x"])
"""


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PREFECT_API_URL": os.environ.get("PREFECT_API_URL", "")}
    return subprocess.run([sys.executable, "-m", "trialflow.cli", *args], capture_output=True, text=True, env=env,
                          timeout=180)


def _serve_and_check(result, root: Path, trials: list) -> None:
    port = free_port()
    chosen = ",".join(t.id for t in trials)
    started = _cli("tensorboard", "start", result.experiment_id, "--root", str(root), "--trials", chosen,
                   "--port", str(port))
    assert started.returncode == 0, started.stdout + started.stderr
    url = f"http://127.0.0.1:{port}/"
    assert url in started.stdout
    try:
        assert requests.get(url, timeout=10).status_code == 200
        # one run per trial, named by its id ("<id>/." : the root of the trial's folder)
        runs = wait_for(lambda: (r := requests.get(url + "data/runs", timeout=10).json()) and len(r) >= len(trials)
                        and r, timeout=60)
        assert sorted(runs) == sorted(f"{t.id}/." for t in trials)
        for trial in trials:
            points = wait_for(lambda t=trial: requests.get(url + "data/plugin/scalars/scalars",
                                                           params={"run": f"{t.id}/.", "tag": "loss"},
                                                           timeout=10).json(), timeout=60)
            assert [(step, value) for _, step, value in points] == [
                (s, pytest.approx(trial.parameters["x"] * s)) for s in range(3)]
        assert raw_request(port, "GET", "/data/runs") == ""  # another user of the machine: closed unanswered
        again = _cli("tensorboard", "start", result.experiment_id, "--root", str(root), "--port", "0")
        assert again.returncode == 1 and "already serves" in again.stdout
    finally:
        stopped = _cli("tensorboard", "stop", result.experiment_id, "--root", str(root))
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    with pytest.raises(requests.ConnectionError):
        requests.get(url, timeout=5)
    assert "no TensorBoard" in _cli("tensorboard", "stop", result.experiment_id, "--root", str(root)).stdout


def test_tensorboard_serves_local_trials_logs_and_stops(tmp_path, monkeypatch):
    write_trial(tmp_path / "code", TRIAL)
    result = run_experiment(base_config(tmp_path / "code", tmp_path / "w", maxTrialNumber=3))
    assert result.status == "DONE"
    # Another user of the machine made TensorBoard's folder in the shared temporary directory first and
    # linked every name TensorBoard could write there (pid-<pid>.info, any pid) to a file of this user's.
    shared_tmp, victim = tmp_path / "shared-tmp", tmp_path / "victim"
    (shared_tmp / ".tensorboard-info").mkdir(parents=True, mode=0o777)
    victim.write_text("this user's file\n")
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    for pid in range(1, pid_max + 1):
        (shared_tmp / ".tensorboard-info" / f"pid-{pid}.info").symlink_to(victim)
    monkeypatch.setenv("TMPDIR", str(shared_tmp))
    try:
        _serve_and_check(result, tmp_path / "w", result.trials[:2])  # --trials picks two of the three
        assert victim.read_text() == "this user's file\n"  # TensorBoard wrote through none of the links
    finally:
        shutil.rmtree(shared_tmp)


def test_tensorboard_copies_remote_trials_logs(tmp_path, sshd_servers, known_hosts):
    write_trial(tmp_path / "code", TRIAL)
    service = {"platform": "remote", "knownHostsFile": str(known_hosts),
               "machineList": [machine(sshd_servers[0], tmp_path / "remote0")]}
    result = run_experiment(base_config(tmp_path / "code", tmp_path / "w", maxTrialNumber=2, trainingService=service))
    assert result.status == "DONE"
    _serve_and_check(result, tmp_path / "w", result.trials)
    for trial in result.trials:  # served from the copies, not the remote folders
        assert list((tmp_path / "w" / result.experiment_id / "trials" / trial.id / "tensorboard").glob("events.*"))


def test_tensorboard_without_logs_or_unknown_trials_says_what_is_wrong(tmp_path):
    write_trial(tmp_path / "code", "import nni\nnni.get_next_parameter()\nnni.report_final_result(1)\n")
    result = run_experiment(base_config(tmp_path / "code", tmp_path / "w", maxTrialNumber=1))
    nothing = _cli("tensorboard", "start", result.experiment_id, "--root", str(tmp_path / "w"), "--port", "0")
    assert nothing.returncode == 1 and "NNI_OUTPUT_DIR" in nothing.stdout
    unknown = _cli("tensorboard", "start", result.experiment_id, "--root", str(tmp_path / "w"), "--trials", "nope")
    assert unknown.returncode == 1 and "no trial nope" in unknown.stdout


def test_where_the_kernel_cannot_name_a_connections_user_tensorboard_on_loopback_stops_with_one_line(
        tmp_path, monkeypatch):
    """Else it would refuse every connection, its own user's too; on a --host the user gave it is open
    by their choice, and serves."""
    from trialflow.presentation import tensorboard_own_user

    write_trial(tmp_path / "code", TRIAL)
    result = run_experiment(base_config(tmp_path / "code", tmp_path / "w", maxTrialNumber=1))
    assert result.status == "DONE"
    env = {**os.environ, **without_sock_diag(tmp_path / "sandbox")}
    said = subprocess.run([sys.executable, "-m", "trialflow.cli", "tensorboard", "start", result.experiment_id,
                           "--root", str(tmp_path / "w"), "--port", str(free_port())],
                          capture_output=True, text=True, env=env, timeout=180)
    assert said.returncode == 1, said.stdout + said.stderr
    assert "TensorBoard cannot tell which user makes a connection to it" in said.stdout, said.stdout + said.stderr
    assert "Traceback" not in said.stdout + said.stderr
    assert "no TensorBoard" in _cli("tensorboard", "stop", result.experiment_id, "--root", str(tmp_path / "w")).stdout

    class Bound:  # what TensorBoard's server is once bound, without a socket: where it listens
        def __init__(self, address: str) -> None:
            self.server_address = (address, 6006)

        def server_close(self) -> None:
            pass

    refusal = "TensorBoard cannot tell which user makes a connection to it"
    monkeypatch.setattr(tensorboard_own_user, "lookup_refusal", lambda _name: refusal)
    with pytest.raises(SystemExit, match=refusal):
        tensorboard_own_user.own_user_server(Bound)("127.0.0.1")
    assert not tensorboard_own_user.own_user_server(Bound)("192.0.2.7").loopback  # --host: it starts
