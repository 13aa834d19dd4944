"""Slurm over a real single-node cluster on 127.0.0.1 (munged, slurmctld, slurmd): the shipped
contract from a login node and over SSH, with and without reuse; Slurm's own events (scancel,
time limit, requeue) and a retried submission."""

from __future__ import annotations

import dataclasses
import re
import secrets
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import base_config, slurm_section, wait_for
from trialflow.config import ConfigError, parse_config
from trialflow.config.sections.slurm import SlurmConfig
from trialflow.platforms import LostHandleError, PlatformError, TrialHandle, TrialStatus
from trialflow.platforms.slurm import SlurmTrainingService
from trialflow.testing.contract import (
    SLEEPING_TRIAL,
    InterruptionContract,
    TrainingServiceContract,
    poll_until_terminal,
    prepared,
    spec_maker,
    wait_for_status,
)


def slurm_service(tmp_path: Path, cluster, server=None, known_hosts=None, **fields) -> SlurmTrainingService:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    section = slurm_section(cluster, tmp_path / "cluster", server, trialCommand='python3 "$NNI_TRIAL_JOB_ID.py"',
                            trialCodeDirectory=str(code), **fields)
    if known_hosts is not None:
        section["knownHostsFile"] = str(known_hosts)
    # a fresh experiment id per test: job names (tf-<experiment>-<trial>) are what a retried submit looks up
    return SlurmTrainingService(SlurmConfig.model_validate(section), tmp_path / "exp" / secrets.token_hex(4))


@pytest.fixture(params=["login-node", "login-node-reuse", "ssh"])  # SSH + reuse: test_slurm_experiment.py
def service(request, tmp_path, slurm_cluster, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    server = known = None
    if request.param.startswith("ssh"):
        server, known = request.getfixturevalue("sshd_servers")[0], request.getfixturevalue("known_hosts")
    svc = prepared(slurm_service(tmp_path, slurm_cluster, server, known, reuseMode=request.param.endswith("reuse")),
                   tmp_path / "code")
    yield svc
    svc.close()


@pytest.fixture
def make_spec(service, tmp_path):
    return spec_maker(service, tmp_path / "code")


class TestSlurmContract(TrainingServiceContract):
    pass


class TestSlurmInterruptions(InterruptionContract):
    @pytest.fixture
    def service(self, tmp_path, slurm_cluster, monkeypatch):
        monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
        svc = prepared(slurm_service(tmp_path, slurm_cluster), tmp_path / "code")
        yield svc
        svc.close()

    @pytest.fixture
    def interrupt(self, slurm_cluster):
        def requeue(handle):
            slurm_cluster.run("scontrol", "requeue", handle.data["job_id"])
            return f"Slurm job {handle.data['job_id']}"
        return requeue


def _running(svc, trial_id: str, body: str = SLEEPING_TRIAL):
    handle = svc.submit(spec_maker(svc, svc.config.trial_code_directory)(trial_id, body, {"x": 1}), svc.code)
    wait_for_status(svc, handle, TrialStatus.RUNNING)
    return handle


def _until(svc, handle, done):
    """Poll until ``done(update)``; returns that update."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        update = svc.poll(handle, {})
        if done(update):
            return update
        time.sleep(0.2)
    raise AssertionError(f"no such update within 60 s; last {update}")


def test_a_requeue_is_an_interruption_within_the_budget_and_a_failure_beyond(tmp_path, slurm_cluster, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    svc = prepared(slurm_service(tmp_path, slurm_cluster), tmp_path / "code")
    handle = _running(svc, "Requ1")
    slurm_cluster.run("scontrol", "requeue", handle.data["job_id"])
    update = _until(svc, handle, lambda u: u.interrupted is not None or u.status.is_terminal)
    assert update.status == TrialStatus.WAITING and f"Slurm job {handle.data['job_id']}" in update.interrupted
    svc.cancel(handle, TrialStatus.SYS_CANCELED)

    spent = svc.submit(dataclasses.replace(spec_maker(svc, tmp_path / "code")("Requ2", SLEEPING_TRIAL, {}),
                                           attempt=3), svc.code)
    spent = TrialHandle(spent.trial_id, spent.platform, {**spent.data, "attempt": 3})
    assert spent.data["job"].endswith("-Requ2-r3")
    wait_for_status(svc, spent, TrialStatus.RUNNING)
    slurm_cluster.run("scontrol", "requeue", spent.data["job_id"])
    update = _until(svc, spent, lambda u: u.status.is_terminal)
    assert update.status == TrialStatus.FAILED and "(maxInterruptions: 3)" in update.message
    svc.cancel(spent, TrialStatus.SYS_CANCELED)
    svc.close()


def test_a_job_submitted_from_this_login_node_does_not_carry_the_controllers_credentials(tmp_path, slurm_cluster,
                                                                                          monkeypatch):
    """sbatch hands the submitting environment on to the job: the controller's own secrets stay out."""
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    monkeypatch.setenv("PGPASSWORD", "pg-pass-123")
    monkeypatch.setenv("MY_OWN_TOKEN", "kept")
    svc = prepared(slurm_service(tmp_path, slurm_cluster), tmp_path / "code")
    body = ("import os, nni\nnni.get_next_parameter()\n"
            "nni.report_final_result({'default': 1, 'env': dict(os.environ)})\n")
    try:
        handle = svc.submit(spec_maker(svc, tmp_path / "code")("EnvS1", body, {}), svc.code)
        _, metrics, _ = poll_until_terminal(svc, handle)
    finally:
        svc.close()
    seen = metrics[-1].value["env"]
    assert seen.get("MY_OWN_TOKEN") == "kept" and "PGPASSWORD" not in seen


def test_a_retried_submit_finds_its_job_and_a_requeued_job_never_runs_the_trial_twice(tmp_path, slurm_cluster,
                                                                                     monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    svc = prepared(slurm_service(tmp_path, slurm_cluster), tmp_path / "code")
    spec = spec_maker(svc, tmp_path / "code")("Twice1", SLEEPING_TRIAL, {})
    first, again = svc.submit(spec, svc.code), svc.submit(spec, svc.code)
    assert first.data["job_id"] == again.data["job_id"]
    assert [line for line in slurm_cluster.run("squeue", "-h", "-o", "%j").split() if line.endswith("Twice1")] == [
        first.data["job"]]
    svc.cancel(first, TrialStatus.USER_CANCELED)
    _until(svc, first, lambda u: u.status.is_terminal)
    script = Path(first.data["trial_dir"]) / ".nni" / "slurm-0.sh"  # what a requeued job runs again
    done = subprocess.run(["sh", str(script)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and "not twice" in done.stderr
    svc.close()


def test_close_leaves_no_allocation_for_idle_environments_or_cancelled_trials(tmp_path, slurm_cluster, monkeypatch):
    """Reuse: after a Ctrl-C (cancel, then close) no environment job is left holding an allocation;
    an environment whose trial still runs is left alone."""
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    svc = prepared(slurm_service(tmp_path, slurm_cluster, reuseMode=True), tmp_path / "code")
    cancelled, running = _running(svc, "Gone1"), _running(svc, "Stay1")
    svc.cancel(cancelled, TrialStatus.USER_CANCELED)
    svc.close()

    def state(handle):
        return slurm_cluster.run("squeue", "-h", "-t", "all", "-o", "%T", "-j", handle.data["job_id"]).strip()

    wait_for(lambda: state(cancelled) in ("CANCELLED", "COMPLETED"), timeout=30)
    assert state(running) == "RUNNING"
    slurm_cluster.run("scancel", running.data["job_id"])


def test_a_lost_trials_job_is_cancelled_so_its_allocation_goes_to_the_next_trials(tmp_path, slurm_cluster,
                                                                                  monkeypatch):
    """A trial whose directory is removed while its job runs: the poll that finds it lost cancels the
    job, which no one follows any more, instead of leaving it holding its allocation."""
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    svc = prepared(slurm_service(tmp_path, slurm_cluster), tmp_path / "code")
    lost = _running(svc, "Lost1")
    try:
        shutil.rmtree(lost.data["trial_dir"])
        with pytest.raises(LostHandleError, match="no longer exists"):
            svc.poll(lost, {})
        wait_for(lambda: slurm_cluster.run("squeue", "-h", "-t", "all", "-o", "%T", "-j", lost.data["job_id"]
                                           ).strip() in ("CANCELLED", "COMPLETED"), timeout=30)
    finally:
        slurm_cluster.run("scancel", lost.data["job_id"])
        svc.close()


@pytest.mark.parametrize(("fields", "message"), [
    ({"timeLimit": "an hour"}, "timeLimit 'an hour' is not a Slurm time"),
    ({"sbatchOptions": ["--output=/tmp/x"]}, "'--output=/tmp/x' is set by trialflow for each job; remove it"),
    ({"host": "login.example", "user": "me", "sshKeyFile": "/nonexistent/key"}, 'sshKeyFile "/nonexistent/key" is '
     "not a file"),
    ({"memory": "16 GB"}, "memory '16 GB' is not a Slurm size: use a number with K, M, G or T, e.g. 16G"),
])
def test_bad_sections_are_refused_naming_the_field(tmp_path, fields, message):
    (tmp_path / "code").mkdir()
    config = base_config(tmp_path / "code", tmp_path / "w",
                         trainingService={"platform": "slurm", **fields})
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_config(config)


def test_a_cluster_that_does_not_answer_fails_at_start_with_the_hint(tmp_path, slurm_cluster, monkeypatch):
    dead = tmp_path / "dead.conf"  # the test cluster's config with nothing listening at its controller's port
    dead.write_text(re.sub(r"(?m)^SlurmctldPort=\d+", "SlurmctldPort=1", slurm_cluster.conf.read_text()))
    monkeypatch.setenv("SLURM_CONF", str(dead))
    with pytest.raises(PlatformError, match="^Slurm does not answer on this machine: .*Unable to contact slurm "
                                            "controller.* set loginCommand$") as caught:
        slurm_service(tmp_path, slurm_cluster).prepare()
    assert "\n" not in str(caught.value)
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    with pytest.raises(PlatformError, match="partition 'gpu' is not on the cluster \\(partitions: debug\\)"):
        slurm_service(tmp_path, slurm_cluster, partition="gpu").prepare()
