"""DLTS service through ``requests`` against the dashboard emulator: the contract (reuse on and off,
metrics over HTTP and through the shared work directory), job bodies validated against the
dashboard's validators, the state table, refusals, faults, and the password kept out of every
message and log line (urllib3's request lines included)."""

from __future__ import annotations

import logging

import pytest

from tests.conftest import (
    DLTS_EMAIL,
    DLTS_PASSWORD,
    DLTS_TEAM,
    FINAL_ONLY,
    dlts_section,
    job_platform,
    wait_for,
    write_trial,
)
from trialflow.config.platforms import PLATFORM_CONFIGS
from trialflow.platforms import PlatformError, TransientPlatformError, TrialSpec, TrialStatus
from trialflow.platforms.dlts import FIXED_FIELDS, STATES, dlts_state
from trialflow.testing.contract import (
    SLEEPING_TRIAL,
    InterruptionContract,
    JobPlatformContract,
    poll_until_terminal,
    prepared,
    submit_retrying,
    wait_for_status,
)
from trialflow.testing.emulators.platform_specs import dlts_body_errors

pytestmark = pytest.mark.usefixtures("dlts_emulator")  # its contract's service fixture starts it

COMMAND = 'python3 "$NNI_TRIAL_JOB_ID.py"'
VARIANTS = {"dlts": (False, "http"), "dlts-reuse": (True, "http"), "dlts-file": (False, "file")}


dlts_service, service, _run_one = job_platform(dlts_section, "dlts_emulator", VARIANTS)


class TestDLTSContract(JobPlatformContract):
    pass


class TestDLTSInterruptions(InterruptionContract):
    """The cluster pauses the trial's job for other work (a preemptible job)."""

    @pytest.fixture
    def service(self, tmp_path, dlts_emulator):
        svc = prepared(dlts_service(tmp_path, dlts_emulator, preemptible=True), tmp_path / "code")
        yield svc
        svc.close()

    @pytest.fixture
    def interrupt(self, dlts_emulator):
        def pause(handle):
            [job] = dlts_emulator.named(handle.data["job"])
            assert job.params["preemptionAllowed"] == "True"  # preemptible: true
            dlts_emulator.pause_job(job.id)
            return f"DLTS job {handle.data['job']} was pa"
        return pause


def test_job_bodies_are_nnis_and_pass_the_dashboards_validator(tmp_path, dlts_emulator):
    svc = dlts_service(tmp_path, dlts_emulator, trialGpuNumber=2)
    svc.prepare()
    assert svc._gpu_type == "P40"  # fetched from the team's cluster record, as NNI did
    body = svc.job_body(svc.job_name("trial", "Abc12"), ["sh", "/home/alice/nni/run.sh"], "t")
    assert dlts_body_errors("job", body) == []
    assert body["jobName"] == f"nni_exp_{svc.experiment_id}_trial_Abc12"
    assert (body["team"], body["vcName"], body["userName"], body["resourcegpu"], body["gpuType"]) == \
        (DLTS_TEAM, DLTS_TEAM, DLTS_EMAIL, 2, "P40")
    assert {k: body[k] for k in FIXED_FIELDS} == FIXED_FIELDS and body["preemptionAllowed"] == "False"
    assert body["cmd"].endswith("&& sh /home/alice/nni/run.sh") and "TRIALFLOW_METRICS_TOKEN_FILE=" in body["cmd"]
    assert dlts_body_errors("job", {"jobName": "x"}) == ["<root>: 'team' is a required property"]
    assert dlts_body_errors("status", {"status": "killing"}) == []
    svc.close()


@pytest.mark.parametrize("state,expected", [
    ("unapproved", TrialStatus.WAITING), ("queued", TrialStatus.WAITING), ("scheduling", TrialStatus.WAITING),
    ("running", TrialStatus.RUNNING), ("pausing", TrialStatus.RUNNING), ("paused", TrialStatus.RUNNING),
    ("finished", TrialStatus.SUCCEEDED), ("failed", TrialStatus.FAILED), ("error", TrialStatus.FAILED),
    ("killing", TrialStatus.SYS_CANCELED), ("killed", TrialStatus.SYS_CANCELED),
])
def test_dlts_state_table(tmp_path, dlts_emulator, state, expected):
    svc = dlts_service(tmp_path, dlts_emulator)
    found, _ = dlts_state({"jobName": "j", "jobStatus": state, "jobStatusDetail": [{"message": "why"}]})
    assert svc.apply_states("j", found, STATES) == expected
    assert svc.apply_states("j", "migrating", STATES) == expected  # unknown: the previous state stays


def test_a_job_killed_by_someone_else_is_sys_canceled_and_a_paused_one_is_killed(tmp_path, dlts_emulator):
    """Killed outside trialflow: SYS_CANCELED. Paused by the cluster: trialflow kills it, and it is an
    interruption (a failure once maxInterruptions is used up)."""
    svc, handle = _run_one(tmp_path, dlts_emulator, "Kill1", SLEEPING_TRIAL, maxInterruptions=0)
    wait_for_status(svc, handle, TrialStatus.RUNNING)
    dlts_emulator.kill_job(dlts_emulator.named(handle.data["job"])[0].id)
    statuses, _, update = poll_until_terminal(svc, handle)
    assert statuses[-1] == TrialStatus.SYS_CANCELED and "killed outside trialflow" in update.message
    write_trial(tmp_path / "code", SLEEPING_TRIAL, "Pause1.py")
    code = svc.upload_code(tmp_path / "code")
    paused = svc.submit(TrialSpec(svc.experiment_id, "Pause1", 1, 1, {}, COMMAND, tmp_path / "code"), code)
    wait_for_status(svc, paused, TrialStatus.RUNNING)
    job = dlts_emulator.named(paused.data["job"])[0]
    dlts_emulator.pause_job(job.id)
    wait_for(lambda: job.status == "paused", timeout=10)
    statuses, _, update = poll_until_terminal(svc, paused)
    assert statuses[-1] == TrialStatus.FAILED and "was paused by the cluster" in update.message
    assert "(maxInterruptions: 0)" in update.message
    # trialflow asked to kill the paused job instead of waiting on it; the cluster applies it at its next tick
    wait_for(lambda: job.status == "killed", timeout=10)
    svc.close()


def test_our_kill_is_user_canceled(tmp_path, dlts_emulator):
    svc, handle = _run_one(tmp_path, dlts_emulator, "Mine1", SLEEPING_TRIAL)
    wait_for_status(svc, handle, TrialStatus.RUNNING)
    svc.cancel(handle, TrialStatus.EARLY_STOPPED)
    assert poll_until_terminal(svc, handle)[0][-1] == TrialStatus.EARLY_STOPPED
    wait_for(lambda: dlts_emulator.named(handle.data["job"])[0].status == "killed", timeout=10)
    svc.close()


def test_an_error_answer_is_a_refusal_not_a_job(tmp_path, dlts_emulator):
    svc = dlts_service(tmp_path, dlts_emulator, gpuType="V100", trialGpuNumber=1)
    svc.prepare()
    write_trial(tmp_path / "code", FINAL_ONLY, "Ref1.py")
    code = svc.upload_code(tmp_path / "code")
    with pytest.raises(PlatformError, match="refused job .*Cannot create job!no GPU type 'V100'") as err:
        svc.submit(TrialSpec(svc.experiment_id, "Ref1", 0, 0, {}, COMMAND, tmp_path / "code"), code)
    assert not isinstance(err.value, TransientPlatformError)
    svc.close()


def test_a_wrong_password_fails_at_start_without_showing_it(tmp_path, dlts_emulator, caplog):
    caplog.set_level(logging.DEBUG)
    with pytest.raises(PlatformError) as err:
        dlts_service(tmp_path, dlts_emulator, password="wrong-password-1234").prepare()
    message = str(err.value)
    assert "refused the credentials (HTTP 403" in message and dlts_emulator.url in message
    assert "wrong-password-1234" not in message and "wrong-password-1234" not in caplog.text
    assert "**********" in caplog.text  # urllib3's request line was logged, with the password scrubbed
    with pytest.raises(PlatformError, match="team 'nni-team' has no cluster 'east'"):
        dlts_service(tmp_path, dlts_emulator, cluster="east").prepare()


def test_credentials_come_from_nnis_environment_variables(tmp_path, dlts_emulator, monkeypatch):
    monkeypatch.setenv("DLWS_USER_EMAIL", DLTS_EMAIL)
    monkeypatch.setenv("DLTS_JOB_TOKEN", DLTS_PASSWORD)
    monkeypatch.setenv("DLWS_VC_NAME", DLTS_TEAM)
    config = PLATFORM_CONFIGS["dlts"](trial_command="x", trial_code_directory=tmp_path,
                                      dashboard=dlts_emulator.url, localStorageMountPoint=str(tmp_path))
    assert (config.email, config.team, config.password.get_secret_value()) == (DLTS_EMAIL, DLTS_TEAM, DLTS_PASSWORD)
    assert config.dashboard == dlts_emulator.url + "/" and config.container_storage_mount_point == str(tmp_path)
    monkeypatch.delenv("DLTS_JOB_TOKEN")
    with pytest.raises(ValueError, match="email and password are required"):
        PLATFORM_CONFIGS["dlts"](trial_command="x", trial_code_directory=tmp_path, dashboard="d",
                                 localStorageMountPoint=str(tmp_path))


@pytest.mark.parametrize("fault", ["5xx", "dropped-before", "dropped-after-create"])
def test_submit_faults_leave_exactly_one_job(tmp_path, dlts_emulator, fault):
    svc = dlts_service(tmp_path, dlts_emulator)
    svc.prepare()
    write_trial(tmp_path / "code", FINAL_ONLY, "Flt1.py")
    code = svc.upload_code(tmp_path / "code")
    if fault == "5xx":
        dlts_emulator.fail_next(3, 500, method="POST")
    else:
        dlts_emulator.drop_next(1, method="POST", after=fault == "dropped-after-create")
    handle = submit_retrying(svc, TrialSpec(svc.experiment_id, "Flt1", 0, 0, {}, COMMAND, tmp_path / "code"), code)
    assert len(dlts_emulator.named(handle.data["job"])) == 1
    statuses, metrics, _ = poll_until_terminal(svc, handle)
    assert statuses[-1] == TrialStatus.SUCCEEDED and [m.value for m in metrics] == [1]
    svc.close()


def test_a_restarted_controller_finds_its_jobs_by_name(tmp_path, dlts_emulator):
    svc, handle = _run_one(tmp_path, dlts_emulator, "Find1", SLEEPING_TRIAL)
    wait_for_status(svc, handle, TrialStatus.RUNNING)
    fresh = type(svc)(svc.config, svc.experiment_dir)  # knows no job id yet
    fresh.prepare()
    fresh.adopt(handle)
    assert fresh.poll(handle, {}).status == TrialStatus.RUNNING
    fresh.cancel(handle, TrialStatus.USER_CANCELED)
    wait_for(lambda: dlts_emulator.named(handle.data["job"])[0].status == "killed", timeout=10)
    fresh.close()
    svc.close()
