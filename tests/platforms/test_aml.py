"""Azure ML service through ``azure-ai-ml`` and a real azure-identity credential against the
workspace emulator: the contract (reuse on and off, metrics over HTTP and through the datastore),
the command job sent, the state table, credentials (refused, chosen from the block), faults without
duplicate jobs, and the SDK as an optional extra."""

from __future__ import annotations

import sys

import pytest

from tests.conftest import (
    FINAL_ONLY,
    aml_section,
    job_platform,
    service_of,
    submit_one,
    wait_for,
    wait_until_trial_runs,
)
from trialflow.platforms import PlatformError, TransientPlatformError, TrialSpec, TrialStatus
from trialflow.platforms.aml import STATES
from trialflow.testing.contract import (
    SLEEPING_TRIAL,
    InterruptionContract,
    JobPlatformContract,
    poll_until_terminal,
    prepared,
    submit_retrying,
    wait_for_status,
)

pytestmark = pytest.mark.usefixtures("aml_emulator")  # its contract's service fixture starts it

VARIANTS = {"aml": (False, "http"), "aml-reuse": (True, "http"), "aml-file": (False, "file")}


aml_service, service, _run_one = job_platform(aml_section, "aml_emulator", VARIANTS)


class TestAzureMLContract(JobPlatformContract):
    pass


class TestAzureMLInterruptions(InterruptionContract):
    """Azure ML preempts the spot node under the trial's job and queues the job again."""

    @pytest.fixture(params=[False, True], ids=["job", "reuse"])
    def service(self, request, tmp_path, aml_emulator):
        svc = prepared(aml_service(tmp_path, aml_emulator, reuse=request.param, jobTier="Spot"), tmp_path / "code")
        yield svc
        svc.close()

    @pytest.fixture
    def interrupt(self, aml_emulator):
        def preempt(handle):
            job = aml_emulator.jobs[handle.data["job"]]
            assert job.body["properties"]["queueSettings"]["jobTier"] == "Spot"
            aml_emulator.preempt(job.name)
            return "Azure ML "  # runs the job again (seen queued after it ran), or preempted its node
        return preempt


def test_a_job_whose_node_was_preempted_is_an_interruption_even_unseen_in_the_queue(tmp_path, aml_emulator):
    """Polled only after the job queued again ran and failed (its run again found the trial claimed and
    ran nothing), or after a preemption Azure ML did not requeue: the compute's node list says the
    node under the job was preempted. A trial's own failure stays a failure."""
    for trial, requeue in (("Node1", True), ("Node2", False)):
        svc, handle = _run_one(tmp_path, aml_emulator, trial, SLEEPING_TRIAL, maxInterruptions=0)
        wait_until_trial_runs(svc, trial)
        job = aml_emulator.jobs[handle.data["job"]]
        node = job.node
        aml_emulator.preempt(job.name, requeue=requeue)
        wait_for(lambda job=job: job.status == "Failed", timeout=30)
        if requeue:
            assert job.node != node and "runs again only as a new job" in (
                aml_emulator.directory / "jobs" / f"{job.name}.log").read_text()
        statuses, _, update = poll_until_terminal(svc, handle)
        assert statuses[-1] == TrialStatus.FAILED and f"Azure ML preempted node {node} of compute" in update.message
        assert "(maxInterruptions: 0)" in update.message
        svc.close()
    svc, handle = _run_one(tmp_path, aml_emulator, "Own3", "import sys\nsys.exit(3)\n")
    statuses, _, update = poll_until_terminal(svc, handle)
    assert statuses[-1] == TrialStatus.FAILED and update.interrupted is None and "exit code 3" in update.message
    svc.close()


def test_command_jobs_mount_the_datastore_and_carry_nnis_names(tmp_path, aml_emulator):
    svc, handle = _run_one(tmp_path, aml_emulator, "Job1A")
    assert poll_until_terminal(svc, handle)[0][-1] == TrialStatus.SUCCEEDED
    name = handle.data["job"]
    assert name == f"nni_exp_{svc.experiment_id}_trial_job1a11"  # lowercase, the letters' case in a suffix
    props = aml_emulator.jobs[name].body["properties"]
    assert props["jobType"] == "Command" and props["experimentName"] == f"nni_exp_{svc.experiment_id}"
    assert props["computeId"].endswith("/computes/cpu-cluster") and props["displayName"] == name
    assert props["inputs"] == {"nni": {"uri": "azureml://datastores/workspaceworkingdirectory/paths/",
                                       "mode": "ReadWriteMount", "jobInputType": "uri_folder"}}
    assert props["environmentId"] in aml_emulator.environments
    assert "'${{inputs.nni}}/nni/" in props["command"]  # paths on the mounted datastore, resolved by Azure ML
    svc.close()


@pytest.mark.parametrize("state,expected", [
    *((s, TrialStatus.WAITING) for s in ("NotStarted", "Starting", "Provisioning", "Preparing", "Queued",
                                          "Paused")),
    ("Running", TrialStatus.RUNNING), ("Finalizing", TrialStatus.RUNNING), ("Completed", TrialStatus.SUCCEEDED),
    ("Failed", TrialStatus.FAILED), ("NotResponding", TrialStatus.FAILED),
    ("CancelRequested", TrialStatus.SYS_CANCELED), ("Canceled", TrialStatus.SYS_CANCELED),
])
def test_aml_state_table(tmp_path, aml_emulator, state, expected):
    svc = aml_service(tmp_path, aml_emulator)
    assert svc.apply_states("j", state, STATES) == expected
    assert svc.apply_states("j", "Unknown", STATES) == expected  # the previous state stays


def test_a_job_cancelled_by_the_workspace_is_sys_canceled_and_ours_user_canceled(tmp_path, aml_emulator):
    svc, handle = _run_one(tmp_path, aml_emulator, "Can1", SLEEPING_TRIAL)
    wait_for_status(svc, handle, TrialStatus.RUNNING)
    aml_emulator.cancel_by_platform(handle.data["job"])
    statuses, _, update = poll_until_terminal(svc, handle)
    assert statuses[-1] == TrialStatus.SYS_CANCELED and "stopped outside trialflow (Can" in update.message
    mine = submit_one(svc, tmp_path, "Can2", SLEEPING_TRIAL)
    wait_for_status(svc, mine, TrialStatus.RUNNING)
    svc.cancel(mine, TrialStatus.EARLY_STOPPED)
    assert poll_until_terminal(svc, mine)[0][-1] == TrialStatus.EARLY_STOPPED
    wait_for(lambda: aml_emulator.jobs[mine.data["job"]].status == "Canceled", timeout=10)
    svc.close()


def test_a_refused_credential_fails_at_start_with_the_fix(tmp_path, aml_emulator, monkeypatch):
    monkeypatch.setenv("IDENTITY_HEADER", "not-the-identity-header")
    with pytest.raises(PlatformError, match="credential was refused .*check the Azure ML credentials block") as err:
        aml_service(tmp_path, aml_emulator).prepare()
    assert not isinstance(err.value, TransientPlatformError)


def test_the_credential_comes_from_the_block(tmp_path, aml_emulator, prefect_server):
    from azure.identity import ClientSecretCredential, ManagedIdentityCredential

    from trialflow.blocks import AzureMLCredentials

    AzureMLCredentials(tenant_id="t-1", client_id="c-1", client_secret="aml-client-secret-1").save(
        "aml-sp", overwrite=True)
    AzureMLCredentials(managed_identity=True).save("aml-mi", overwrite=True)
    AzureMLCredentials(use_default_credential=False).save("aml-none", overwrite=True)
    assert isinstance(aml_service(tmp_path, aml_emulator, credentials="aml-sp").credential(), ClientSecretCredential)
    assert isinstance(aml_service(tmp_path, aml_emulator, credentials="aml-mi").credential(),
                      ManagedIdentityCredential)
    with pytest.raises(PlatformError, match="holds no credential"):
        aml_service(tmp_path, aml_emulator, credentials="aml-none").credential()
    svc, handle = _run_one(tmp_path, aml_emulator, "Mi1", credentials="aml-mi")
    assert poll_until_terminal(svc, handle)[0][-1] == TrialStatus.SUCCEEDED
    svc.close()


def test_nnis_config_without_a_mount_fails_at_start_naming_it(tmp_path, aml_emulator):
    section = aml_section(aml_emulator)
    section.pop("localStorageMountPoint")
    with pytest.raises(PlatformError, match="datastore 'workspaceworkingdirectory' is not mounted on this machine"):
        service_of(tmp_path, section).prepare()


def test_a_missing_sdk_names_the_extra(tmp_path, aml_emulator, monkeypatch):
    monkeypatch.setitem(sys.modules, "azure.ai.ml", None)
    with pytest.raises(PlatformError, match=r"pip install 'trialflow\[aml\]'"):
        aml_service(tmp_path, aml_emulator).prepare()


@pytest.mark.parametrize("fault", ["5xx", "throttled", "dropped-before", "dropped-after-create"])
def test_submit_faults_leave_exactly_one_job(tmp_path, aml_emulator, fault):
    svc = aml_service(tmp_path, aml_emulator)
    svc.prepare()
    (tmp_path / "code" / "Flt1.py").write_text(FINAL_ONLY)
    code = svc.upload_code(tmp_path / "code")
    if fault == "5xx":
        aml_emulator.fail_next(2, 503, method="PUT", path="/jobs/")
    elif fault == "throttled":
        aml_emulator.fail_next(2, 429, method="PUT", path="/jobs/", retry_after=1)
    else:
        aml_emulator.drop_next(1, method="PUT", after=fault == "dropped-after-create", path="/jobs/")
    spec = TrialSpec(svc.experiment_id, "Flt1", 0, 0, {}, svc.config.trial_command, tmp_path / "code")
    handle = submit_retrying(svc, spec, code)
    assert poll_until_terminal(svc, handle)[0][-1] == TrialStatus.SUCCEEDED
    assert [n for n in aml_emulator.jobs if svc.experiment_id in n] == [handle.data["job"]]
    svc.close()
