"""PAI-DLC service through the official SDK against the API emulator (signatures verified): the
contract (reuse on and off, metrics over HTTP and through the NAS), NNI's CreateJob request, the
state table, SDK errors mapped to transient and permanent ones, faults (5xx, throttling, dropped
connections) without duplicate jobs, and AccessKeys kept out of every message."""

from __future__ import annotations

import sys

import pytest

from tests.conftest import (
    DLC_KEY_ID,
    DLC_KEY_SECRET,
    DLC_NAS,
    FINAL_ONLY,
    dlc_section,
    job_platform,
    submit_one,
    wait_for,
    wait_until_trial_runs,
)
from trialflow.platforms import PlatformError, TransientPlatformError, TrialSpec, TrialStatus
from trialflow.platforms.dlc import STATES, endpoint_of
from trialflow.testing.contract import (
    SLEEPING_TRIAL,
    InterruptionContract,
    JobPlatformContract,
    poll_until_terminal,
    prepared,
    submit_retrying,
    wait_for_status,
)

pytestmark = pytest.mark.usefixtures("dlc_emulator")  # its contract's service fixture starts it

VARIANTS = {"dlc": (False, "http"), "dlc-reuse": (True, "http"), "dlc-file": (False, "file")}


dlc_service, service, _run_one = job_platform(dlc_section, "dlc_emulator", VARIANTS)


class TestDLCContract(JobPlatformContract):
    pass


class TestDLCInterruptions(InterruptionContract):
    """PAI-DLC reclaims the spot instance under the trial's pod."""

    @pytest.fixture(params=[False, True], ids=["job", "reuse"])
    def service(self, request, tmp_path, dlc_emulator):
        svc = prepared(dlc_service(tmp_path, dlc_emulator, reuse=request.param, spotDiscountLimit=0.4),
                       tmp_path / "code")
        yield svc
        svc.close()

    @pytest.fixture
    def interrupt(self, dlc_emulator):
        def reclaim(handle):
            [job] = dlc_emulator.named(handle.data["job"])
            [spec] = job.body["JobSpecs"]
            assert spec["SpotSpec"] == {"SpotStrategy": "SpotWithPriceLimit", "SpotDiscountLimit": 0.4}
            assert spec["UseSpotInstance"] is True
            dlc_emulator.evict(job.id)
            return "PAI-DLC evicted pod"
        return reclaim


def test_a_job_restarted_in_place_is_an_interruption_and_its_pod_run_again_runs_nothing(tmp_path, dlc_emulator):
    """PAI-DLC restarts a job's pod in place (fault tolerance): the pod run again finds the trial
    claimed (its only replica) and runs nothing; the trial's run is an interruption, a failure once
    maxInterruptions is used up. A trial's own failure stays a failure."""
    svc, handle = _run_one(tmp_path, dlc_emulator, "Restart1", SLEEPING_TRIAL, maxInterruptions=0)
    wait_until_trial_runs(svc, "Restart1")
    [job] = dlc_emulator.named(handle.data["job"])
    dlc_emulator.restart(job.id)
    wait_for(lambda: job.status == "Failed", timeout=30)  # the pod run again exited 1 at once
    assert "runs again only as a new job" in (dlc_emulator.directory / "jobs" / f"{job.pods[0][0]}.log").read_text()
    assert dlc_emulator.record(job)["RestartTimes"] == "1/3"
    statuses, _, update = poll_until_terminal(svc, handle)
    assert statuses[-1] == TrialStatus.FAILED and "PAI-DLC runs job" in update.message
    assert "(maxInterruptions: 0)" in update.message
    svc, handle = _run_one(tmp_path, dlc_emulator, "Own2", "import sys\nsys.exit(3)\n")
    statuses, _, update = poll_until_terminal(svc, handle)
    assert statuses[-1] == TrialStatus.FAILED and update.interrupted is None and "exit code 3" in update.message
    svc.close()


def test_create_requests_are_nnis_and_the_emulator_saw_them_signed(tmp_path, dlc_emulator):
    svc, handle = _run_one(tmp_path, dlc_emulator, "Req1", podCount=2)
    assert poll_until_terminal(svc, handle)[0][-1] == TrialStatus.SUCCEEDED
    (job,) = dlc_emulator.named(handle.data["job"])
    body = job.body
    assert body["DisplayName"] == f"nni_exp_{svc.experiment_id}_trial_Req1" and body["JobType"] == "TFJob"
    (spec,) = body["JobSpecs"]  # the SDK adds empty lists (ElasticSpotSpecs, ...) to what NNI set
    assert {k: spec[k] for k in ("Type", "Image", "PodCount", "EcsSpec")} == {
        "Type": "Worker", "Image": dlc_section(dlc_emulator)["image"], "PodCount": 2, "EcsSpec": "ecs.c6.large"}
    assert body["DataSources"] == [{"DataSourceId": DLC_NAS, "MountPath": "/root/data/"}]
    assert body["WorkspaceId"] == "ws-1" and "TRIALFLOW_METRICS_TOKEN_FILE=/root/data/nni/" in body["UserCommand"]
    assert len(job.pods) == 2  # both pods ran; the first to claim the trial ran it
    svc.close()


@pytest.mark.parametrize("state,expected", [
    *((s, TrialStatus.WAITING) for s in ("Creating", "Queuing", "Dequeued", "Bidding", "EnvPreparing",
                                          "SanityChecking")),
    *((s, TrialStatus.RUNNING) for s in ("Running", "Restarting", "SucceededReserving", "FailedReserving")),
    ("Succeeded", TrialStatus.SUCCEEDED), ("Failed", TrialStatus.FAILED),
    ("Stopping", TrialStatus.SYS_CANCELED), ("Stopped", TrialStatus.SYS_CANCELED),
])
def test_dlc_state_table(tmp_path, dlc_emulator, state, expected):
    svc = dlc_service(tmp_path, dlc_emulator)
    assert svc.apply_states("j", state, STATES) == expected
    assert svc.apply_states("j", "SomeNewState", STATES) == expected  # unknown: the previous state stays


def test_endpoints_follow_nni_and_the_override():
    assert endpoint_of("cn-hangzhou", None) == ("pai-dlc.cn-hangzhou.aliyuncs.com", "https")
    assert endpoint_of("share", None) == ("pai-dlc-share.aliyuncs.com", "https")
    assert endpoint_of("cn-hangzhou", "http://127.0.0.1:8080") == ("127.0.0.1:8080", "http")


def test_a_job_stopped_by_the_platform_is_sys_canceled_and_ours_is_user_canceled(tmp_path, dlc_emulator):
    svc, handle = _run_one(tmp_path, dlc_emulator, "Stop1", SLEEPING_TRIAL)
    wait_for_status(svc, handle, TrialStatus.RUNNING)
    dlc_emulator.stop_by_platform(dlc_emulator.named(handle.data["job"])[0].id)
    statuses, _, update = poll_until_terminal(svc, handle)
    assert statuses[-1] == TrialStatus.SYS_CANCELED and "stopped outside trialflow" in update.message
    write = submit_one(svc, tmp_path, "Stop2", SLEEPING_TRIAL)
    wait_for_status(svc, write, TrialStatus.RUNNING)
    svc.cancel(write, TrialStatus.USER_CANCELED)
    assert poll_until_terminal(svc, write)[0][-1] == TrialStatus.USER_CANCELED
    wait_for(lambda: dlc_emulator.named(write.data["job"])[0].status == "Stopped", timeout=10)
    svc.close()


def test_a_wrong_access_key_fails_at_start_with_the_fix_and_no_secret(tmp_path, dlc_emulator):
    with pytest.raises(PlatformError) as err:
        dlc_service(tmp_path, dlc_emulator, accessKeySecret="not-the-secret-1234").prepare()
    message = str(err.value)
    assert "SignatureDoesNotMatch" in message and "check accessKeyId / accessKeySecret" in message
    assert "not-the-secret-1234" not in message and not isinstance(err.value, TransientPlatformError)
    with pytest.raises(PlatformError, match="InvalidAccessKeyId.NotFound") as err:
        dlc_service(tmp_path, dlc_emulator, accessKeyId="LTAInobody").prepare()
    assert "LTAInobody" not in str(err.value)


def test_an_invalid_request_is_a_permanent_error_naming_the_field(tmp_path, dlc_emulator):
    svc = dlc_service(tmp_path, dlc_emulator, nasDataSourceId="nas-unknown")
    with pytest.raises(PlatformError, match="HTTP 400 InvalidParameter.DataSource: .*nas-unknown does not") as err:
        submit_one(svc, tmp_path, "Inv1", FINAL_ONLY)
    assert not isinstance(err.value, TransientPlatformError)
    svc.close()


def test_a_missing_sdk_names_the_extra(tmp_path, dlc_emulator, monkeypatch):
    monkeypatch.setitem(sys.modules, "alibabacloud_pai_dlc20201203", None)
    with pytest.raises(PlatformError, match=r"pip install 'trialflow\[dlc\]'"):
        dlc_service(tmp_path, dlc_emulator).prepare()


@pytest.mark.parametrize("reuse", [False, True], ids=["trial-job", "environment"])
@pytest.mark.parametrize("fault", ["5xx", "throttled", "dropped-before", "dropped-after-create"])
def test_submit_faults_leave_exactly_one_job(tmp_path, dlc_emulator, fault, reuse):
    svc = dlc_service(tmp_path, dlc_emulator, reuse=reuse)
    svc.prepare()
    (tmp_path / "code" / "Flt1.py").write_text(FINAL_ONLY)
    code = svc.upload_code(tmp_path / "code")
    if fault == "5xx":
        dlc_emulator.fail_next(2, 503, method="POST")
    elif fault == "throttled":
        dlc_emulator.fail_next(2, 429, method="POST", retry_after=1)
    else:
        dlc_emulator.drop_next(1, method="POST", after=fault == "dropped-after-create")
    spec = TrialSpec(svc.experiment_id, "Flt1", 0, 0, {}, svc.config.trial_command, tmp_path / "code")
    handle = submit_retrying(svc, spec, code)
    assert len(dlc_emulator.named(handle.data["job"])) == 1
    assert poll_until_terminal(svc, handle)[0][-1] == TrialStatus.SUCCEEDED
    mine = [j for j in dlc_emulator.jobs.values() if svc.experiment_id in j.body["DisplayName"]]
    assert len(mine) == 1 and len(svc.envs) == int(reuse)  # a retried start is the same environment
    svc.close()


def test_throttling_is_transient_and_signatures_never_show(tmp_path, dlc_emulator):
    svc, handle = _run_one(tmp_path, dlc_emulator, "Thr1")
    dlc_emulator.fail_next(1, 429, method="GET", retry_after=2)
    with pytest.raises(TransientPlatformError, match="Throttling.User") as err:
        svc.poll(handle, {})
    assert DLC_KEY_SECRET not in str(err.value) and DLC_KEY_ID not in str(err.value)
    dlc_emulator.drop_next(1, method="GET")
    with pytest.raises(TransientPlatformError) as err:
        svc.poll(handle, {})
    assert DLC_KEY_ID not in str(err.value) and "Signature=" not in str(err.value).replace("Signature=*", "")
    assert poll_until_terminal(svc, handle)[0][-1] == TrialStatus.SUCCEEDED
    svc.close()
