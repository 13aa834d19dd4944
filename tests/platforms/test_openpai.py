"""OpenPAI service through ``requests`` against the REST server emulator: the contract (reuse on
and off, metrics over HTTP and through the shared storage), job protocols validated against the
published schema, the state table, the pylon / bare REST server / TLS front ends, faults, and the
token kept out of protocols and logs."""

from __future__ import annotations

import logging

import pytest
import requests
import yaml

from tests.conftest import (
    FINAL_ONLY,
    PAI_STORAGE,
    PAI_TOKEN,
    PAI_USER,
    job_platform,
    openpai_section,
    wait_for,
    wait_until_trial_runs,
    write_trial,
)
from trialflow.config.platforms import PLATFORM_CONFIGS
from trialflow.platforms import PlatformError, TransientPlatformError, TrialSpec, TrialStatus
from trialflow.platforms.openpai import STATES, openpai_state
from trialflow.testing.contract import (
    SLEEPING_TRIAL,
    InterruptionContract,
    JobPlatformContract,
    poll_until_terminal,
    prepared,
    submit_retrying,
    wait_for_status,
)
from trialflow.testing.emulators.openpai import OpenPAIEmulator
from trialflow.testing.emulators.platform_specs import openpai_protocol_errors, openpai_response_errors

pytestmark = pytest.mark.usefixtures("openpai_emulator")  # its contract's service fixture starts it

COMMAND = 'python3 "$NNI_TRIAL_JOB_ID.py"'
VARIANTS = {"openpai": (False, "http"), "openpai-reuse": (True, "http"), "openpai-file": (False, "file"),
            "openpai-reuse-logs": (True, "logs")}


pai_service, service, _run_one = job_platform(openpai_section, "openpai_emulator", VARIANTS)


class TestOpenPAIContract(JobPlatformContract):
    pass


class TestOpenPAIInterruptions(InterruptionContract):
    """The hived scheduler preempts an opportunistic job's pod for other work; OpenPAI runs the job
    again as a platform retry."""

    @pytest.fixture(params=[False, True], ids=["job", "reuse"])
    def service(self, request, tmp_path, openpai_emulator):
        svc = prepared(pai_service(tmp_path, openpai_emulator, reuse=request.param, jobPriorityClass="oppo"),
                       tmp_path / "code")
        yield svc
        svc.close()

    @pytest.fixture
    def interrupt(self, openpai_emulator):
        def preempt(handle):
            job = openpai_emulator.job(handle.data["job"])  # the trial's own, or its environment's
            assert job.protocol["extras"]["hivedScheduler"] == {"jobPriorityClass": "oppo"}
            openpai_emulator.preempt(job.name)
            return "1 platform retry, now attempt 1"
        return preempt


def test_a_retried_job_runs_nothing_again_and_a_platform_failure_without_retry_is_an_interruption(
        tmp_path, openpai_emulator):
    """The attempt OpenPAI runs after a preemption finds the trial claimed and runs nothing (the
    details show the retry as the swagger describes it); a job ended by a transient platform failure
    it did not retry (a lost node here) is an interruption too, a failure once maxInterruptions is used
    up; a trial's own failure stays a failure."""
    svc, handle = _run_one(tmp_path, openpai_emulator, "Pre1", SLEEPING_TRIAL)
    wait_until_trial_runs(svc, "Pre1")
    job = openpai_emulator.job(handle.data["job"])
    openpai_emulator.preempt(job.name)
    wait_for(lambda: job.state == "FAILED", timeout=30)  # its second attempt ran nothing and exited 1
    detail = openpai_emulator.detail(job)
    assert openpai_response_errors("JobDetail", detail) == []
    assert detail["jobStatus"]["retryDetails"] == {"user": 0, "platform": 1, "resource": 0}
    assert "runs again only as a new job" in (openpai_emulator.directory / "jobs" / f"{PAI_USER}~{job.name}" /
                                              "taskrole-0.log").read_text()
    update = svc.poll(handle, {})
    assert update.interrupted and "OpenPAI runs job" in update.interrupted and "platform retry" in update.interrupted
    svc.close()

    svc, handle = _run_one(tmp_path, openpai_emulator, "Lost1", SLEEPING_TRIAL, maxInterruptions=0)
    wait_for_status(svc, handle, TrialStatus.RUNNING)
    openpai_emulator.preempt(handle.data["job"], code=-1001, retry=False)  # the job ends FAILED
    statuses, _, update = poll_until_terminal(svc, handle)
    assert statuses[-1] == TrialStatus.FAILED and "ended by PodNodeLost (exit code -1001" in update.message
    assert "(maxInterruptions: 0)" in update.message
    svc, handle = _run_one(tmp_path, openpai_emulator, "Own1", "import sys\nsys.exit(3)\n")
    statuses, _, update = poll_until_terminal(svc, handle)
    assert statuses[-1] == TrialStatus.FAILED and update.interrupted is None
    spec = openpai_emulator.detail(openpai_emulator.job(handle.data["job"]))["jobStatus"]["appExitSpec"]
    assert (spec["code"], spec["behavior"]) == (3, "UNKNOWN")  # the exit spec's fallback: not transient
    svc.close()


# ---- the job protocol -----------------------------------------------------------------------


def test_protocols_follow_nni_and_validate_against_the_published_schema(tmp_path, openpai_emulator):
    template = {"taskRoles": {"master": {"instances": 1, "dockerImage": "img", "commands": ["ignored"],
                                         "resourcePerInstance": {"cpu": 2, "memoryMB": 4096, "gpu": 1}},
                              "helper": {"instances": 2, "dockerImage": "img", "commands": ["echo helper"],
                                         "resourcePerInstance": {"cpu": 1, "memoryMB": 1024, "gpu": 0}}},
                "prerequisites": [{"type": "dockerimage", "uri": "my/image:1", "name": "img"}],
                "extras": {"storages": [{"name": "other"}]}}
    plain = pai_service(tmp_path, openpai_emulator, virtualCluster="default")
    plain.prepare()  # starts the metrics receiver, whose address the commands export
    custom = pai_service(tmp_path, openpai_emulator, openpaiConfig=template)
    for svc in (plain, custom):
        for kind in ("trial", "env"):
            name = svc.job_name(kind, "Abc12")
            commands = {role: ["sh", "/mnt/x/run.sh"] for role in svc.roles()} if kind == "trial" else \
                {next(iter(svc.roles())): ["sh", "/mnt/x/env.sh"]}
            protocol = svc.protocol(name, commands, f"{name}-token")
            assert openpai_protocol_errors(protocol) == [], protocol
            assert openpai_protocol_errors(yaml.safe_load(yaml.safe_dump(protocol))) == []
            assert protocol["name"] == f"nni_exp_{svc.experiment_id}_{kind}_Abc12"
            assert {"name": PAI_STORAGE} in protocol["extras"]["storages"]
    protocol = plain.protocol("n1", {"taskrole": ["sh", "/mnt/x/run.sh"]}, "n1-token")
    role = protocol["taskRoles"]["taskrole"]
    assert role["resourcePerInstance"] == {"gpu": 0, "cpu": 1, "memoryMB": 1024}
    assert role["completion"] == {"minFailedInstances": 1, "minSucceededInstances": -1}
    assert protocol["prerequisites"] == [{"type": "dockerimage", "uri": "msranni/nni:latest",
                                          "name": "docker_image_0"}]
    assert protocol["defaults"] == {"virtualCluster": "default"} and protocol["jobRetryCount"] == 0
    assert role["commands"][0].endswith("&& sh /mnt/x/run.sh")
    assert "TRIALFLOW_METRICS_TOKEN_FILE=/mnt/confignfs-data/nni/" in role["commands"][0]
    protocol = custom.protocol("n2", {r: ["sh", f"/mnt/x/{r}.sh"] for r in custom.roles()}, "n2-token")
    assert custom.roles() == {"master": COMMAND, "helper": "echo helper"}  # the first role runs the trial
    assert protocol["taskRoles"]["helper"]["instances"] == 2
    assert protocol["taskRoles"]["master"]["resourcePerInstance"]["gpu"] == 1  # the user's resources stay
    assert [s["name"] for s in protocol["extras"]["storages"]] == ["other", PAI_STORAGE]
    env = custom.protocol("n3", {"master": ["sh", "/mnt/x/env.sh"]}, "n3-token")
    assert list(env["taskRoles"]) == ["master"]  # a reuse environment runs the primary role only
    plain.close()


@pytest.mark.parametrize("mutate,message", [
    (lambda p: p.update(name="bad name!"), "does not match"),
    (lambda p: p.update(surprise=1), "surprise: unknown field"),
    (lambda p: p.update(taskRoles={}), "at least one task role"),
    (lambda p: p["taskRoles"].update({"1st": p["taskRoles"]["taskrole"]}), "valid C identifier"),
    (lambda p: p["taskRoles"]["taskrole"].pop("commands"), "'commands' is a required property"),
    (lambda p: p["taskRoles"]["taskrole"].update(dockerImage="nope"), "names no dockerimage prerequisite"),
])
def test_the_emulator_refuses_invalid_protocols_like_the_rest_server(tmp_path, openpai_emulator, mutate, message):
    svc = pai_service(tmp_path, openpai_emulator)
    protocol = svc.protocol("nni_exp_x_trial_bad", {"taskrole": ["true"]}, "t")
    mutate(protocol)
    answer = requests.post(f"{openpai_emulator.url}/rest-server/api/v2/jobs", data=yaml.safe_dump(protocol),
                           headers={"Content-Type": "text/yaml", "Authorization": f"Bearer {PAI_TOKEN}"}, timeout=10)
    assert answer.status_code == 400 and answer.json()["code"] == "InvalidProtocolError"
    assert message in answer.json()["message"]


def test_a_refused_protocol_is_a_permanent_error_naming_the_server(tmp_path, openpai_emulator):
    svc = pai_service(tmp_path, openpai_emulator, openpaiConfig={"taskRoles": {"main": {
        "dockerImage": "missing", "commands": ["x"], "resourcePerInstance": {"cpu": 1, "memoryMB": 1, "gpu": 0}}},
        "prerequisites": [{"type": "dockerimage", "uri": "i", "name": "img"}]})
    svc.prepare()
    write_trial(tmp_path / "code", FINAL_ONLY, "Bad1.py")
    code = svc.upload_code(tmp_path / "code")
    with pytest.raises(PlatformError, match="InvalidProtocolError.*names no dockerimage") as err:
        svc.submit(TrialSpec(svc.experiment_id, "Bad1", 0, 0, {}, COMMAND, tmp_path / "code"), code)
    assert not isinstance(err.value, TransientPlatformError)
    svc.close()


def test_job_details_served_match_the_swagger(tmp_path, openpai_emulator):
    svc, handle = _run_one(tmp_path, openpai_emulator, "Shape1")
    poll_until_terminal(svc, handle)
    job = openpai_emulator.job(handle.data["job"])
    assert openpai_response_errors("JobDetail", openpai_emulator.detail(job)) == []
    listed = requests.get(f"{openpai_emulator.url}/rest-server/api/v2/jobs", params={"username": PAI_USER},
                          headers={"Authorization": f"Bearer {PAI_TOKEN}"}, timeout=10).json()
    assert openpai_response_errors("JobSummary", listed) == []
    assert openpai_response_errors("JobDetail", {"name": "x", "jobStatus": {"state": "DONE"}}) != []  # it checks
    svc.close()


# ---- states ---------------------------------------------------------------------------------


@pytest.mark.parametrize("state,expected", [
    ("WAITING", TrialStatus.WAITING), ("RUNNING", TrialStatus.RUNNING), ("SUCCEEDED", TrialStatus.SUCCEEDED),
    ("FAILED", TrialStatus.FAILED), ("STOPPING", TrialStatus.SYS_CANCELED), ("STOPPED", TrialStatus.SYS_CANCELED),
])
def test_openpai_state_table(tmp_path, openpai_emulator, state, expected):
    svc = pai_service(tmp_path, openpai_emulator)
    found, message = openpai_state({"name": "j", "jobStatus": {"state": state, "appExitCode": 3}})
    assert svc.apply_states("j", found, STATES) == expected
    assert (message is not None) == (state in ("FAILED", "STOPPING", "STOPPED"))


def test_an_unknown_state_keeps_the_previous_one(tmp_path, openpai_emulator, caplog):
    svc = pai_service(tmp_path, openpai_emulator)
    assert svc.apply_states("j", "RUNNING", STATES) == TrialStatus.RUNNING
    with caplog.at_level(logging.INFO, logger="trialflow.platforms"):
        assert svc.apply_states("j", "UNKNOWN", STATES) == TrialStatus.RUNNING
    assert "OpenPAI job j is in state 'UNKNOWN'" in caplog.text
    assert svc.apply_states("k", "NEW_STATE", STATES) == TrialStatus.WAITING


def test_a_job_stopped_by_someone_else_is_sys_canceled_and_ours_is_user_canceled(tmp_path, openpai_emulator):
    svc, handle = _run_one(tmp_path, openpai_emulator, "Stop1", SLEEPING_TRIAL)
    wait_for_status(svc, handle, TrialStatus.RUNNING)
    openpai_emulator.stop_job(handle.data["job"])
    statuses, _, update = poll_until_terminal(svc, handle)
    assert statuses[-1] == TrialStatus.SYS_CANCELED and "stopped outside trialflow" in update.message
    write_trial(tmp_path / "code", SLEEPING_TRIAL, "Stop2.py")
    code = svc.upload_code(tmp_path / "code")
    mine = svc.submit(TrialSpec(svc.experiment_id, "Stop2", 1, 1, {}, COMMAND, tmp_path / "code"), code)
    wait_for_status(svc, mine, TrialStatus.RUNNING)
    svc.cancel(mine, TrialStatus.USER_CANCELED)
    assert poll_until_terminal(svc, mine)[0][-1] == TrialStatus.USER_CANCELED
    wait_for(lambda: openpai_emulator.job(mine.data["job"]).state == "STOPPED", timeout=30)
    svc.close()


def test_an_environment_stopped_by_someone_else_cancels_its_trial(tmp_path, openpai_emulator):
    svc, handle = _run_one(tmp_path, openpai_emulator, "Env1", SLEEPING_TRIAL, reuse=True)
    wait_for_status(svc, handle, TrialStatus.RUNNING)
    openpai_emulator.stop_job(handle.data["job"])
    statuses, _, update = poll_until_terminal(svc, handle)
    assert statuses[-1] == TrialStatus.SYS_CANCELED and "environment job" in update.message
    svc.close()


# ---- front ends, credentials, TLS -------------------------------------------------------------


def test_the_bare_rest_server_works_as_well_as_pylon(tmp_path):
    storage = tmp_path / "storage"
    storage.mkdir()
    with OpenPAIEmulator(tmp_path / "cluster", {PAI_USER: PAI_TOKEN}, {PAI_STORAGE: storage},
                         front_end="rest-server") as emulator:
        emulator.storage_dir = storage
        svc, handle = _run_one(tmp_path, emulator, "Bare1")
        assert svc.api.base == emulator.url
        assert poll_until_terminal(svc, handle)[0][-1] == TrialStatus.SUCCEEDED
        svc.close()
        assert not any(path.startswith("/rest-server/api/v2/jobs") for _, path in emulator.requests)


def test_a_wrong_token_fails_at_start_naming_the_host_and_the_fix(tmp_path, openpai_emulator):
    svc = pai_service(tmp_path, openpai_emulator, token="wrong-token-0000")
    submitted = len(openpai_emulator.submitted)
    with pytest.raises(PlatformError) as err:
        svc.prepare()
    message = str(err.value)
    assert "refused the credentials (HTTP 401" in message and openpai_emulator.url in message
    assert "Profile > Tokens" in message and "wrong-token-0000" not in message
    assert not isinstance(err.value, TransientPlatformError)
    assert len(openpai_emulator.submitted) == submitted


@pytest.mark.parametrize("field,value,message", [
    ("storageConfigName", "nosuch", "storageConfigName 'nosuch' is not a storage of user 'alice'"),
    ("virtualCluster", "gpu-vc", "virtualCluster 'gpu-vc' is not a virtual cluster of user 'alice'.*: default"),
])
def test_a_storage_or_virtual_cluster_not_the_users_fails_at_start(tmp_path, openpai_emulator, field, value,
                                                                     message):
    with pytest.raises(PlatformError, match=message):
        pai_service(tmp_path, openpai_emulator, **{field: value}).prepare()


def test_no_rest_server_at_the_host_is_a_clear_error(tmp_path, openpai_emulator):
    with pytest.raises(TransientPlatformError, match="REST server at http://127.0.0.1:9/rest-server did not answer"):
        pai_service(tmp_path, openpai_emulator, host="http://127.0.0.1:9").prepare()  # retried, then fails
    portal_only = f"{openpai_emulator.url}/portal"  # pylon's web pages answer, no REST server behind them
    with pytest.raises(PlatformError, match=f"no OpenPAI REST server answers at {portal_only} .*set host"):
        pai_service(tmp_path, openpai_emulator, host=portal_only).prepare()
    section = openpai_section(openpai_emulator, host="pai.example.org")
    section.pop("platform")
    config = PLATFORM_CONFIGS["openpai"](trial_command="x", trial_code_directory=tmp_path, **section)
    assert config.host == "https://pai.example.org"  # NNI adds the scheme


def test_tls_is_verified_with_a_ca_bundle_and_refused_without(tmp_path, caplog):
    storage = tmp_path / "storage"
    storage.mkdir()
    with OpenPAIEmulator(tmp_path / "cluster", {PAI_USER: PAI_TOKEN}, {PAI_STORAGE: storage}, tls=True) as emulator:
        emulator.storage_dir = storage
        assert emulator.url.startswith("https://127.0.0.1:")
        with pytest.raises(PlatformError, match="TLS certificate .*self-signed certificate.*CA bundle \\(caBundle\\)"):
            pai_service(tmp_path, emulator).prepare()
        svc, handle = _run_one(tmp_path, emulator, "Tls1", caBundle=str(emulator.certificate))
        assert poll_until_terminal(svc, handle)[0][-1] == TrialStatus.SUCCEEDED
        svc.close()
        with caplog.at_level(logging.WARNING, logger="trialflow.platforms"):
            svc, handle = _run_one(tmp_path, emulator, "Tls2", verifyTls=False)
        assert "TLS certificates are not verified" in caplog.text
        assert poll_until_terminal(svc, handle)[0][-1] == TrialStatus.SUCCEEDED
        svc.close()


# ---- faults ---------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["5xx", "dropped-before", "dropped-after-create"])
def test_submit_faults_leave_exactly_one_job(tmp_path, openpai_emulator, fault):
    svc = pai_service(tmp_path, openpai_emulator)
    svc.prepare()
    write_trial(tmp_path / "code", FINAL_ONLY, "Flt1.py")
    code = svc.upload_code(tmp_path / "code")
    if fault == "5xx":
        openpai_emulator.fail_next(3, 503, method="POST", path="/jobs$")
    else:
        openpai_emulator.drop_next(1, method="POST", after=fault == "dropped-after-create", path="/jobs$")
    handle = submit_retrying(svc, TrialSpec(svc.experiment_id, "Flt1", 0, 0, {}, COMMAND, tmp_path / "code"), code)
    named = [p for p in openpai_emulator.submitted if p["name"] == handle.data["job"]]
    assert len(named) == 1
    statuses, metrics, _ = poll_until_terminal(svc, handle)
    assert statuses[-1] == TrialStatus.SUCCEEDED and [m.value for m in metrics] == [1]
    svc.close()


def test_poll_errors_are_transient(tmp_path, openpai_emulator):
    svc, handle = _run_one(tmp_path, openpai_emulator, "Poll1")
    openpai_emulator.fail_next(1, 503, method="GET", path="~")
    svc.poll(handle, {})  # one 503 is retried in place
    openpai_emulator.fail_next(4, 502, method="GET", path="~")
    with pytest.raises(TransientPlatformError, match="HTTP 502"):  # four in a row reach the caller
        svc.poll(handle, {})
    openpai_emulator.drop_next(1, method="GET", path="~")
    with pytest.raises(TransientPlatformError, match="did not answer"):
        svc.poll(handle, {})
    assert poll_until_terminal(svc, handle)[0][-1] == TrialStatus.SUCCEEDED
    svc.close()


# ---- secrets --------------------------------------------------------------------------------


def test_tokens_stay_out_of_protocols_commands_and_logs(tmp_path, openpai_emulator, caplog):
    caplog.set_level(logging.DEBUG)
    svc, handle = _run_one(tmp_path, openpai_emulator, "Sec1")
    metric_token = svc.read_token(f"{handle.data['job']}-token")
    assert metric_token
    token_file = svc.storage.path(svc.experiment_id, "tokens", f"{handle.data['job']}-token")
    assert token_file.stat().st_mode & 0o077 == 0  # only its owner reads it
    assert poll_until_terminal(svc, handle)[0][-1] == TrialStatus.SUCCEEDED
    assert not token_file.exists()  # forgotten with its trial
    job = openpai_emulator.job(handle.data["job"])
    for secret in (PAI_TOKEN, metric_token):
        assert secret not in job.text and secret not in caplog.text
        for log_file in (openpai_emulator.directory / "jobs").rglob("*.log"):
            assert secret not in log_file.read_text()
    svc.close()


def test_an_openpai_config_file_is_the_protocol_base_and_checked_at_load(tmp_path, openpai_emulator):
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"taskRoles": {"worker": {"instances": 1, "dockerImage": "img", "commands": ["x"],
                                                            "resourcePerInstance": {"cpu": 4, "memoryMB": 8192,
                                                                                    "gpu": 2}}},
                                   "prerequisites": [{"type": "dockerimage", "uri": "team/image:2", "name": "img"}]}))
    svc = pai_service(tmp_path, openpai_emulator, openpaiConfigFile=str(job))
    protocol = svc.protocol("n4", {"worker": ["sh", "/mnt/x/run.sh"]}, "n4-token")
    assert openpai_protocol_errors(protocol) == []
    assert protocol["taskRoles"]["worker"]["resourcePerInstance"]["gpu"] == 2
    assert protocol["prerequisites"][0]["uri"] == "team/image:2"
    with pytest.raises(ValueError, match="can only be set one"):
        pai_service(tmp_path, openpai_emulator, openpaiConfigFile=str(job), openpaiConfig={"taskRoles": {}})
    with pytest.raises(ValueError, match="is not a file"):
        pai_service(tmp_path, openpai_emulator, openpaiConfigFile=str(tmp_path / "missing.yaml"))
