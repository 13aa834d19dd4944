"""Kubeflow (TFJob, PyTorchJob), FrameworkController and AdaptDL services through the real
``kubernetes`` client against the API emulator: the contract for each (reuse on and off, metrics
over HTTP and through pod logs only), manifests validated against the published CRDs, every row of
each state table, faults, and tokens that stay out of manifests and logs."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import k8s_section, wait_for, write_trial
from trialflow.config.platforms import PLATFORM_CONFIGS
from trialflow.foundation.ids import new_experiment_id
from trialflow.platforms import (
    PlatformError,
    TransientPlatformError,
    TrialSpec,
    TrialStatus,
    create_service,
)
from trialflow.platforms.adaptdl import adaptdl_state
from trialflow.platforms.frameworkcontroller import framework_state
from trialflow.platforms.kubeflow import condition_state
from trialflow.testing.contract import (
    SLEEPING_TRIAL,
    InterruptionContract,
    JobPlatformContract,
    poll_until_terminal,
    prepared,
    submit_retrying,
    wait_for_status,
)
from trialflow.testing.emulators.k8s_schemas import FRAMEWORK_SCHEMA, specs_dir, validate_custom_object
from trialflow.testing.emulators.kubernetes import match_labels

COMMAND = 'python3 "$NNI_TRIAL_JOB_ID.py"'
VARIANTS = {
    "tfjob": ("tfjob", False, "http"), "pytorchjob": ("pytorchjob", False, "http"),
    "framework": ("framework", False, "http"), "adaptdl": ("adaptdl", False, "http"),
    "tfjob-reuse": ("tfjob", True, "http"), "framework-reuse": ("framework", True, "http"),
    "pytorchjob-logs-only": ("pytorchjob", False, "logs"),
    "tfjob-file": ("tfjob", False, "file"), "framework-reuse-file": ("framework", True, "file"),
}


def k8s_service(tmp_path: Path, nfs: Path, kind: str, reuse: bool = False, channel: str = "http", **extra):
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    section = {**k8s_section(kind, nfs, reuse, channel), **extra}
    config = PLATFORM_CONFIGS[section["platform"]](trial_command=COMMAND, trial_code_directory=code, **section)
    return create_service(config, tmp_path / "exp" / new_experiment_id())


@pytest.fixture(params=list(VARIANTS), ids=list(VARIANTS))
def service(request, tmp_path, k8s):
    svc = prepared(k8s_service(tmp_path, k8s.nfs_dir, *VARIANTS[request.param]), tmp_path / "code")
    yield svc
    svc.close()


class TestKubernetesContract(JobPlatformContract):
    def test_metrics_arrive_on_the_configured_channel(self, service, make_spec):
        super().test_metrics_arrive_on_the_configured_channel(service, make_spec)
        if service.channel != "http":
            assert service.receiver is None


# each job kind with one of Kubernetes' ways of ending a pod apart from its command; Kubeflow's
# operator then creates the replica again (restartPolicy: ExitCode), FrameworkController's and
# AdaptDL's jobs fail with the disrupted pod in place
DISRUPTIONS = {"tfjob": "PreemptionByScheduler", "pytorchjob": "TerminationByKubelet",
               "framework": "DeletionByTaintManager", "adaptdl": "EvictionByEvictionAPI",
               "framework-reuse": "PreemptionByScheduler", "tfjob-reuse": "DeletionByTaintManager"}


class TestKubernetesInterruptions(InterruptionContract):
    @pytest.fixture(params=list(DISRUPTIONS))
    def service(self, request, tmp_path, k8s):
        kind, _, reuse = request.param.partition("-")
        svc = prepared(k8s_service(tmp_path, k8s.nfs_dir, kind, reuse=bool(reuse)), tmp_path / "code")
        svc.disruption = DISRUPTIONS[request.param]
        yield svc
        svc.close()

    @pytest.fixture
    def interrupt(self, service, k8s):
        def disrupt(handle):
            selector = service.pod_selector(handle.data["job"])
            running = [p["metadata"] for p in k8s.objects("pods") if p["status"]["phase"] == "Running"
                       and match_labels(p["metadata"]["labels"], selector)]
            # a PyTorchJob's trial is its master; its worker replica (which only echoes) may still run
            masters = [m for m in running if m["labels"].get("training.kubeflow.org/replica-type") == "master"]
            [pod] = [m["name"] for m in masters or running]
            k8s.disrupt(pod, reason=service.disruption, message="emulated")
            if service.platform == "kubeflow":  # the operator creates the stopped replica again in place;
                # a poll before that finds the disrupted pod itself
                return f"job {handle.data['job']}: Kubernetes stopped the trial's pod", f"pod {pod} "
            return f"pod {pod} "
        return disrupt


def test_a_pod_evicted_through_the_eviction_api_is_an_interruption(tmp_path, k8s):
    """``kubectl drain``'s call (the ``kubernetes`` client's ``create_namespaced_pod_eviction``) ends the
    trial's pod; its job's end is reported as an interruption naming the eviction, not a failure."""
    from kubernetes import client, config

    svc = prepared(k8s_service(tmp_path, k8s.nfs_dir, "framework"), tmp_path / "code")
    try:
        write_trial(tmp_path / "code", SLEEPING_TRIAL, "Evict1.py")
        handle = svc.submit(TrialSpec(svc.experiment_id, "Evict1", 0, 0, {}, COMMAND, tmp_path / "code", None),
                            svc.upload_code(tmp_path / "code"))
        wait_for_status(svc, handle, TrialStatus.RUNNING)
        [pod] = [p["metadata"]["name"] for p in k8s.objects("pods")
                 if match_labels(p["metadata"]["labels"], svc.pod_selector(handle.data["job"]))]
        api = client.CoreV1Api(config.new_client_from_config(str(k8s.kubeconfig)))
        api.create_namespaced_pod_eviction(pod, "default", client.V1Eviction(
            metadata=client.V1ObjectMeta(name=pod, namespace="default")))
        update = wait_for(lambda: (u := svc.poll(handle, {})).interrupted is not None and u, timeout=30)
        assert update.status == TrialStatus.WAITING
        assert f"pod {pod} was evicted (a node drain or the cluster autoscaler)" in update.interrupted
        assert "EvictionByEvictionAPI" in update.interrupted
    finally:
        svc.close()


SAVES_ON_SIGTERM = """
import os, signal, sys, time
import nni
os.environ["TRIALFLOW_METRICS_URL"] = "http://127.0.0.1:9"  # its pushes never arrive: stdout lines only
nni.get_next_parameter()
for i in range(3):
    nni.report_intermediate_result(i)
step = 0
def save(*_):
    with open(os.path.join(os.environ["TRIALFLOW_CHECKPOINT_DIR"], "saved"), "w") as f:
        f.write(str(step))
    os._exit(143)  # at once: its pusher would retry its undelivered results at exit
signal.signal(signal.SIGTERM, save)
open(os.path.join(os.environ["TRIALFLOW_CHECKPOINT_DIR"], "ready"), "w").close()
while True:
    step += 1
    time.sleep(0.05)
"""


@pytest.mark.parametrize("kind", ["framework", "tfjob"])  # a job that ends; one whose replica runs again in place
def test_a_disrupted_pods_trial_gets_the_stop_signal_and_saves_before_the_kill(tmp_path, k8s, kind):
    """Kubernetes signals a pod's first process only (the keeper); the keeper passes SIGTERM on, so a
    trial that saves on SIGTERM writes its checkpoint within the grace period, then its run is an
    interruption. Its results whose pushes never arrived come with the interruption, from its output
    on the share: the next run numbers on after them."""
    svc = prepared(k8s_service(tmp_path, k8s.nfs_dir, kind), tmp_path / "code")
    try:
        write_trial(tmp_path / "code", SAVES_ON_SIGTERM, "Save1.py")
        handle = svc.submit(TrialSpec(svc.experiment_id, "Save1", 0, 0, {}, COMMAND, tmp_path / "code", None),
                            svc.upload_code(tmp_path / "code"))
        trial_dir = svc.storage.path(svc.experiment_id, "trials", "Save1")
        wait_for((trial_dir / "checkpoint" / "ready").exists, timeout=30)  # its handler is set
        [pod] = [p["metadata"]["name"] for p in k8s.objects("pods") if p["status"]["phase"] == "Running"
                 and match_labels(p["metadata"]["labels"], svc.pod_selector(handle.data["job"]))]
        k8s.disrupt(pod, reason="PreemptionByScheduler", message="emulated")
        update = wait_for(lambda: (u := svc.poll(handle, {})).interrupted is not None and u, timeout=30)
        # a TFJob's operator may have replaced the disrupted pod before the poll: then the stop is told
        assert "PreemptionByScheduler" in update.interrupted or "Kubernetes stopped the trial's pod" in \
            update.interrupted and kind == "tfjob", update.interrupted
        assert [(m.sequence, m.value) for m in update.metrics if m.type == "PERIODICAL"] == [(0, 0), (1, 1), (2, 2)]
        assert int((trial_dir / "checkpoint" / "saved").read_text()) > 0  # saved on the forwarded SIGTERM
    finally:
        svc.close()


GPU_PROBE = ("import os, nni\nnni.get_next_parameter()\n"
             "nni.report_final_result(os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>'))\n")


@pytest.mark.parametrize(("gpus", "seen"), [(1, "<unset>"), (0, "")])
def test_gpu_visibility_is_left_to_the_device_plugin_unless_the_role_asks_for_none(tmp_path, k8s, gpus, seen):
    from tests.conftest import k8s_section

    role = {**k8s_section("tfjob", k8s.nfs_dir)["worker"], "gpuNumber": gpus}
    svc = k8s_service(tmp_path, k8s.nfs_dir, "tfjob", worker=role)
    svc.prepare()
    try:
        write_trial(tmp_path / "code", GPU_PROBE, "Gpu1.py")
        code = svc.upload_code(tmp_path / "code")
        spec = TrialSpec(svc.experiment_id, "Gpu1", 0, 0, {}, COMMAND, tmp_path / "code", None)
        _, metrics, update = poll_until_terminal(svc, svc.submit(spec, code))
        assert update.status == TrialStatus.SUCCEEDED and [m.value for m in metrics] == [seen]
    finally:
        svc.close()


# ---- manifests and schemas ---------------------------------------------------------------------


def _render(tmp_path, nfs, kind, **extra):
    svc = k8s_service(tmp_path, nfs, kind, **extra)
    roles = svc.roles()
    commands = {role: ["sh", f"/tmp/mount/nni/x/run_{role}.sh"] for role in roles}
    env = [{"name": "TRIALFLOW_METRICS_TOKEN", "valueFrom": {"secretKeyRef": {"name": "t", "key": "token"}}}]
    return svc, svc.manifest(svc.job_name("trial", "AbCde"), {"app": "nni-kubernetes-trial"}, commands, env)


@pytest.mark.parametrize("kind,extra", [
    ("tfjob", {}),
    ("tfjob", {"ps": {"replicas": 2, "command": "python3 ps.py", "cpuNumber": 0.5, "memorySize": "1gb",
                      "gpuNumber": 0}}),
    ("pytorchjob", {}),
    ("framework", {"serviceAccountName": "nni-runner"}),
    ("adaptdl", {"adaptive": True, "imagePullSecrets": [{"name": "regcred"}], "cpuNumber": 2, "memorySize": "4Gi"}),
    ("tfjob", {"storage": {"storageType": "azureStorage", "azureAccount": "acct", "azureShare": "share",
                           "keyVaultName": "vault", "keyVaultKey": "key", "localMountPoint": "."}}),
])
def test_every_generated_manifest_validates_against_the_published_schema(tmp_path, kind, extra):
    svc, manifest = _render(tmp_path, tmp_path, kind, **extra)
    assert validate_custom_object(svc.plural, manifest) == []
    container = _first_container(manifest)
    assert "TRIALFLOW_METRICS_TOKEN" in {e["name"] for e in container["env"]}
    assert all("value" not in e for e in container["env"] if e["name"] == "TRIALFLOW_METRICS_TOKEN")


def _first_container(manifest):
    spec = manifest["spec"]
    if "tfReplicaSpecs" in spec or "pytorchReplicaSpecs" in spec:
        replicas = spec.get("tfReplicaSpecs") or spec["pytorchReplicaSpecs"]
        return next(iter(replicas.values()))["template"]["spec"]["containers"][0]
    if "taskRoles" in spec:
        return spec["taskRoles"][0]["task"]["pod"]["spec"]["containers"][0]
    return spec["template"]["spec"]["containers"][0]


SPOT = {"priorityClassName": "preemptible", "nodeSelector": {"pool": "spot"},
        "tolerations": [{"key": "kubernetes.azure.com/scalesetpriority", "operator": "Equal", "value": "spot",
                         "effect": "NoSchedule"}]}


def _pod_specs(obj):
    """Every pod spec inside a job manifest (its replicas' templates)."""
    if isinstance(obj, dict):
        found = [obj] if "containers" in obj else []
        return found + [spec for value in obj.values() for spec in _pod_specs(value)]
    return [spec for value in obj for spec in _pod_specs(value)] if isinstance(obj, list) else []


@pytest.mark.parametrize("kind", ["tfjob", "pytorchjob", "framework", "adaptdl"])
def test_cheap_capacity_reaches_every_pod_in_kubernetes_terms(tmp_path, k8s, kind):
    """priorityClassName, tolerations and nodeSelector go into every replica's pod spec, validate
    against the published schemas, and reach the pods the operator makes."""
    svc, manifest = _render(tmp_path, tmp_path, kind, **SPOT)
    assert validate_custom_object(svc.plural, manifest) == []
    specs = _pod_specs(manifest["spec"])
    assert specs and all({k: spec.get(k) for k in SPOT} == SPOT for spec in specs)

    svc = prepared(k8s_service(tmp_path, k8s.nfs_dir, kind, **SPOT), tmp_path / "code")
    try:
        write_trial(tmp_path / "code", "import nni\nnni.get_next_parameter()\nnni.report_final_result(1)\n",
                    "Spot1.py")
        handle = svc.submit(TrialSpec(svc.experiment_id, "Spot1", 0, 0, {}, COMMAND, tmp_path / "code", None),
                            svc.upload_code(tmp_path / "code"))
        assert poll_until_terminal(svc, handle)[2].status == TrialStatus.SUCCEEDED
        pods = [p for p in k8s.objects("pods") if match_labels(p["metadata"]["labels"],
                                                              svc.pod_selector(handle.data["job"]))]
        assert pods and all({k: p["spec"].get(k) for k in SPOT} == SPOT for p in pods)
    finally:
        svc.close()


def test_a_toleration_with_an_unknown_field_is_one_clear_line():
    from trialflow.config import KubeflowConfig

    with pytest.raises(ValueError, match=r"tolerations\[0\] has effects; a toleration takes effect, key, operator, "
                                         r"tolerationSeconds, value"):
        KubeflowConfig.model_validate({**k8s_section("tfjob", Path(".")), "trialCommand": "x",
                                       "trialCodeDirectory": ".", "tolerations": [{"key": "a", "effects": "x"}]})


def test_manifests_follow_nni_names_resources_and_storage(tmp_path):
    extra = {"ps": {"replicas": 2, "command": "python3 ps.py", "cpuNumber": 0.5, "memorySize": "1gb", "gpuNumber": 1}}
    svc, manifest = _render(tmp_path, tmp_path, "tfjob", **extra)
    assert manifest["kind"] == "TFJob" and manifest["apiVersion"] == "kubeflow.org/v1"
    assert manifest["metadata"]["name"] == f"nni-exp-{svc.experiment_id}-trial-abcde05"  # case kept in a suffix
    ps = manifest["spec"]["tfReplicaSpecs"]["PS"]
    assert ps["replicas"] == 2 and ps["restartPolicy"] == "ExitCode"
    assert ps["template"]["spec"]["containers"][0]["resources"]["limits"] == {
        "cpu": "0.5", "memory": "1024Mi", "nvidia.com/gpu": "1"}
    assert ps["template"]["spec"]["volumes"] == [{"name": "nni-vol", "nfs": {"server": "nfs.cluster.local",
                                                                            "path": "/exports/nni"}}]
    fc, framework = _render(tmp_path, tmp_path, "framework")
    role = framework["spec"]["taskRoles"][0]
    assert role["frameworkAttemptCompletionPolicy"] == {"minFailedTaskCount": 1, "minSucceededTaskCount": 1}
    assert "FB_WORKER_PORT=4000" in role["task"]["pod"]["spec"]["containers"][0]["command"][2]
    assert framework["metadata"]["name"] == f"nniexp{fc.experiment_id}trialabcde05"


def test_framework_schema_accepts_the_upstream_examples_and_vendored_specs_match():
    import yaml

    for name in ("batchsucceeded.yaml", "batchfailedpermanent.yaml"):
        example = yaml.safe_load((specs_dir() / "frameworkcontroller" / name).read_text())
        assert validate_custom_object("frameworks", example) == []
    assert FRAMEWORK_SCHEMA["properties"]["spec"]["properties"]["description"]["type"] == ["string", "null"]
    shared = Path(__file__).resolve().parents[2].parent / "shared" / "platform-specs"
    packaged = Path(__file__).resolve().parents[2] / "trialflow" / "testing" / "emulators" / "specs"
    if shared.is_dir():
        for sub in ("crds", "frameworkcontroller", "openpai", "dlts"):
            for path in (shared / sub).iterdir():
                assert (packaged / sub / path.name).read_bytes() == path.read_bytes(), path.name


@pytest.mark.parametrize("mutate,message", [
    (lambda m: m["spec"]["tfReplicaSpecs"].update(Boss=m["spec"]["tfReplicaSpecs"]["Worker"]), "Unsupported value"),
    (lambda m: m["spec"]["tfReplicaSpecs"]["Worker"].update(replicas="one"), "is not of type 'integer'"),
    (lambda m: m["spec"].pop("tfReplicaSpecs"), "'tfReplicaSpecs' is a required property"),
    (lambda m: m["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0].update(name="main"),
     "needs a container named 'tensorflow'"),
    (lambda m: m["metadata"].update(name="Upper_Case"), "RFC 1123"),
])
def test_invalid_objects_are_refused_like_an_api_server(tmp_path, mutate, message):
    svc, manifest = _render(tmp_path, tmp_path, "tfjob")
    mutate(manifest)
    assert any(message in p for p in validate_custom_object("tfjobs", manifest))


def test_the_service_reports_the_api_servers_refusal(tmp_path, k8s):
    svc = k8s_service(tmp_path, k8s.nfs_dir, "framework")
    svc.config.task_roles[0].name = "ps-1"  # our config allows dashes; the Framework schema does not
    svc.prepare()
    write_trial(tmp_path / "code", "print(1)\n", "Refu1.py")
    code = svc.upload_code(tmp_path / "code")
    with pytest.raises(PlatformError, match=r"HTTP 422.*taskRoles.*does not match") as err:
        svc.submit(TrialSpec(svc.experiment_id, "Refu1", 0, 0, {}, COMMAND, tmp_path / "code"), code)
    assert not isinstance(err.value, TransientPlatformError)
    svc.close()


# ---- state tables: every row ----------------------------------------------------------------


def _conditions(*types):
    return {"status": {"conditions": [{"type": t, "status": "True", "message": t} for t in types]}}


@pytest.mark.parametrize("obj,expected", [
    ({}, TrialStatus.WAITING),
    (_conditions("Created"), TrialStatus.WAITING),
    (_conditions("Created", "Suspended"), TrialStatus.WAITING),
    (_conditions("Created", "Running"), TrialStatus.RUNNING),
    (_conditions("Created", "Running", "Restarting"), TrialStatus.RUNNING),
    (_conditions("Created", "Running", "Succeeded"), TrialStatus.SUCCEEDED),
    (_conditions("Created", "Running", "Failed"), TrialStatus.FAILED),
    ({"status": {"conditions": [{"type": "Created", "status": "True"}, {"type": "Running", "status": "False"}]}},
     TrialStatus.WAITING),
])
def test_kubeflow_state_table(obj, expected):
    assert condition_state(obj)[0] == expected


def _framework(state, kind=None, code=0):
    completion = {"code": code, "phrase": "x", "type": {"name": kind, "attributes": []}} if kind else None
    return {"status": {"state": state, "attemptStatus": {"completionStatus": completion}}}


@pytest.mark.parametrize("obj,expected", [
    ({}, TrialStatus.WAITING),
    *[(_framework(s), TrialStatus.WAITING) for s in ("AttemptCreationPending", "AttemptCreationRequested",
                                                      "AttemptPreparing")],
    *[(_framework(s), TrialStatus.RUNNING) for s in ("AttemptRunning", "AttemptDeletionPending",
                                                      "AttemptDeletionRequested", "AttemptDeleting",
                                                      "AttemptCompleted")],
    (_framework("Completed", "Succeeded"), TrialStatus.SUCCEEDED),
    (_framework("Completed", "Failed", 210), TrialStatus.FAILED),
    (_framework("Completed", "Failed", -210), TrialStatus.SYS_CANCELED),
])
def test_frameworkcontroller_state_table(obj, expected):
    assert framework_state(obj)[0] == expected


@pytest.mark.parametrize("status,expected", [
    ({}, TrialStatus.WAITING), ({"phase": "Pending"}, TrialStatus.WAITING),
    ({"phase": "Starting"}, TrialStatus.WAITING),
    ({"phase": "Pending", "reason": "ImagePullBackOff"}, TrialStatus.FAILED),
    ({"phase": "Starting", "reason": "ErrImagePull"}, TrialStatus.FAILED), ({"phase": "Running"}, TrialStatus.RUNNING),
    ({"phase": "Stopping"}, TrialStatus.RUNNING), ({"phase": "Succeeded"}, TrialStatus.SUCCEEDED),
    ({"phase": "Failed", "reason": "PodFailure"}, TrialStatus.FAILED),
])
def test_adaptdl_state_table(status, expected):
    assert adaptdl_state({"status": status})[0] == expected


# ---- faults -------------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["5xx", "dropped-before", "dropped-after-create"])
def test_submit_faults_are_retried_without_a_duplicate_job(tmp_path, k8s, fault):
    svc = k8s_service(tmp_path, k8s.nfs_dir, "tfjob")
    svc.prepare()
    write_trial(tmp_path / "code", "import nni\nnni.get_next_parameter()\nnni.report_final_result(1)\n", "Flt1.py")
    code = svc.upload_code(tmp_path / "code")
    spec = TrialSpec(svc.experiment_id, "Flt1", 0, 0, {}, COMMAND, tmp_path / "code")
    posts = k8s.count("POST", "tfjobs")
    if fault == "5xx":
        k8s.fail_next(3, 503, method="POST")
    else:
        k8s.drop_next(1, method="POST", after=fault == "dropped-after-create")
    handle = submit_retrying(svc, spec, code)
    jobs = [j for j in k8s.objects("tfjobs") if j["metadata"]["labels"]["expId"] == svc.experiment_id]
    assert len(jobs) == 1
    if fault == "dropped-after-create":
        assert k8s.count("POST", "tfjobs") == posts + 1  # the retry found the job instead of posting again
    statuses, metrics, _ = poll_until_terminal(svc, handle)
    assert statuses[-1] == TrialStatus.SUCCEEDED and [m.value for m in metrics] == [1]
    svc.close()


def test_poll_errors_are_transient_and_a_deleted_job_is_sys_canceled(tmp_path, k8s):
    from kubernetes import client, config

    svc = k8s_service(tmp_path, k8s.nfs_dir, "pytorchjob")
    svc.prepare()
    write_trial(tmp_path / "code", SLEEPING_TRIAL, "Del1.py")
    code = svc.upload_code(tmp_path / "code")
    handle = svc.submit(TrialSpec(svc.experiment_id, "Del1", 0, 0, {}, COMMAND, tmp_path / "code"), code)
    k8s.fail_next(1, 500, method="GET")
    with pytest.raises(TransientPlatformError, match="HTTP 500"):
        svc.poll(handle, {})
    deadline = time.monotonic() + 30
    while svc.poll(handle, {}).status != TrialStatus.RUNNING and time.monotonic() < deadline:
        time.sleep(0.05)
    api = client.CustomObjectsApi(config.new_client_from_config(config_file=str(k8s.kubeconfig)))
    api.delete_namespaced_custom_object("kubeflow.org", "v1", "default", "pytorchjobs", handle.data["job"])
    statuses, _, update = poll_until_terminal(svc, handle)
    assert statuses[-1] == TrialStatus.SYS_CANCELED and "deleted outside trialflow" in update.message
    svc.close()


def test_unreachable_api_server_and_missing_storage_are_clear_errors(tmp_path, k8s, monkeypatch):
    svc = k8s_service(tmp_path, k8s.nfs_dir, "tfjob")
    svc.config.storage.local_mount_point = None
    svc.storage = svc.make_storage()
    with pytest.raises(PlatformError, match="localMountPoint"):
        svc.prepare()
    kubeconfig = tmp_path / "dead-kubeconfig"
    kubeconfig.write_text(k8s.kubeconfig.read_text().replace(k8s.url, "http://127.0.0.1:9"))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    with pytest.raises(TransientPlatformError, match="cannot reach the Kubernetes API server"):
        k8s_service(tmp_path, k8s.nfs_dir, "tfjob").prepare()
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(PlatformError, match="no kubeconfig found"):
        k8s_service(tmp_path, k8s.nfs_dir, "tfjob").prepare()


def test_token_is_only_in_a_secret_never_in_manifests_or_logs(tmp_path, k8s):
    svc = k8s_service(tmp_path, k8s.nfs_dir, "framework")
    svc.prepare()
    body = "import os, nni\nnni.get_next_parameter()\nprint('trial output')\nnni.report_final_result(2)\n"
    write_trial(tmp_path / "code", body, "Tok1.py")
    code = svc.upload_code(tmp_path / "code")
    handle = svc.submit(TrialSpec(svc.experiment_id, "Tok1", 0, 0, {}, COMMAND, tmp_path / "code"), code)
    secret = svc.api.read_secret(f"{handle.data['job']}-token")
    token = secret["token"]
    assert len(token) >= 32
    framework = next(o for o in k8s.objects("frameworks") if o["metadata"]["name"] == handle.data["job"])
    assert token not in repr(framework)
    poll_until_terminal(svc, handle)
    assert svc.api.read_secret(f"{handle.data['job']}-token") is None  # removed when the trial ended
    for root in (k8s.nfs_dir / "nni" / svc.experiment_id, k8s.directory / "pods", tmp_path / "exp"):
        for path in root.rglob("*"):
            if path.is_file():
                assert token.encode() not in path.read_bytes(), path
    svc.close()


def test_a_remote_cluster_without_nni_manager_ip_is_refused_at_start(tmp_path, k8s, monkeypatch):
    from trialflow.platforms.k8s_api import KubeApi

    remote = tmp_path / "kubeconfig"
    remote.write_text(Path(k8s.kubeconfig).read_text().replace("127.0.0.1", "192.0.2.10"))
    monkeypatch.setenv("KUBECONFIG", str(remote))

    def never(self):  # the check must come first: nothing is sent to that address
        raise AssertionError("the cluster was contacted")

    monkeypatch.setattr(KubeApi, "check_namespace", never)
    svc = k8s_service(tmp_path, k8s.nfs_dir, "tfjob")
    with pytest.raises(PlatformError, match="nniManagerIp is not set") as err:
        svc.prepare()
    assert "192.0.2.10" in str(err.value) and "metricChannel: logs" in str(err.value)
    for channel, fields in (("http", {"nniManagerIp": "10.0.0.5"}), ("logs", {})):
        ok = k8s_service(tmp_path, k8s.nfs_dir, "tfjob", False, channel, **fields)
        with pytest.raises(AssertionError, match="contacted"):  # past the check, on to the cluster
            ok.prepare()


def test_a_poll_failing_half_way_loses_no_metric(tmp_path, k8s):
    svc = k8s_service(tmp_path, k8s.nfs_dir, "tfjob", True, "http")
    svc.prepare()
    try:
        body = "import nni, time\nnni.get_next_parameter()\nnni.report_intermediate_result(1.5)\ntime.sleep(30)\n"
        write_trial(tmp_path / "code", body, "Half1.py")
        code = svc.upload_code(tmp_path / "code")
        handle = svc.submit(TrialSpec(svc.experiment_id, "Half1", 0, 0, {}, COMMAND, tmp_path / "code", None), code)
        deadline = time.monotonic() + 30
        while svc.receiver.stats.accepted == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert svc.receiver.stats.accepted == 1  # pushed, waiting in the receiver
        for env in svc.envs.values():
            env.checked = 0.0  # the environment's job is looked up in this poll...
        k8s.fail_next(1, 503)  # ...and the API fails it
        with pytest.raises(TransientPlatformError):
            svc.poll(handle, {})
        assert [m.value for m in svc.poll(handle, {}).metrics] == [1.5]  # the next poll still has it
        svc.cancel(handle, TrialStatus.USER_CANCELED)
    finally:
        svc.close()


FRAMEWORK_TEMPLATE = """
apiVersion: frameworkcontroller.microsoft.com/v1
kind: Framework
metadata:
  name: mytemplate
  labels: {team: vision}
spec:
  executionType: Start
  retryPolicy: {fancyRetryPolicy: false, maxRetryCount: 0}
  taskRoles:
  - name: worker
    taskNumber: 1
    frameworkAttemptCompletionPolicy: {minFailedTaskCount: 1, minSucceededTaskCount: 1}
    task:
      retryPolicy: {fancyRetryPolicy: false, maxRetryCount: 0}
      pod:
        spec:
          restartPolicy: Never
          containers:
          - name: trainer
            image: my.registry/vision:1.2
            command: [python3, "Tmpl1.py"]
            env: [{name: FROM_TEMPLATE, value: "kept"}]
            volumeMounts: [{name: data, mountPath: /tmp/mount}]
          volumes:
          - name: data
            persistentVolumeClaim: {claimName: nni-pvc}
"""


def test_nnis_v1_framework_template_with_pvc_storage_runs_a_trial(tmp_path, k8s):
    import warnings

    import yaml

    from trialflow.config import parse_config

    (tmp_path / "template.yaml").write_text(FRAMEWORK_TEMPLATE)
    pvc_dir = k8s.directory / "pvc" / "default" / "nni-pvc"  # the claim's volume, as this machine sees it
    pvc_dir.mkdir(parents=True, exist_ok=True)
    code = tmp_path / "code"
    body = "import os, nni\nnni.get_next_parameter()\nnni.report_final_result(os.environ['FROM_TEMPLATE'])\n"
    write_trial(code, body, "Tmpl1.py")
    v1 = {"authorName": "nni", "experimentName": "fc-template", "trialConcurrency": 1, "maxTrialNum": 1,
          "trainingServicePlatform": "frameworkcontroller", "searchSpacePath": "space.json",
          "tuner": {"builtinTunerName": "Random"}, "trial": {"codeDir": str(code)},
          "frameworkcontrollerConfig": {"storage": "pvc", "configPath": str(tmp_path / "template.yaml"),
                                        "serviceAccountName": "frameworkcontroller", "pvc": {"path": str(pvc_dir)}}}
    (tmp_path / "space.json").write_text('{"x": {"_type": "choice", "_value": [1]}}')
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = parse_config(yaml.safe_load(yaml.safe_dump(v1)), base_dir=tmp_path)
    section = config.services[0]
    assert section.storage.storage_type == "pvc" and not section.reuse_mode and section.trial_command == ""
    svc = create_service(section, tmp_path / "exp" / new_experiment_id())
    svc.api.ensure("pvc", {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "nni-pvc"},
                           "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}})
    svc.prepare()
    try:
        code_ref = svc.upload_code(code)
        handle = svc.submit(TrialSpec(svc.experiment_id, "Tmpl1", 0, 0, {"x": 1}, "", code, None), code_ref)
        _, metrics, update = poll_until_terminal(svc, handle)
        assert update.status == TrialStatus.SUCCEEDED and [m.value for m in metrics] == ["kept"]
        [job] = [j for j in k8s.objects("frameworks") if j["metadata"]["labels"].get("expId") == svc.experiment_id]
        assert job["metadata"]["name"].endswith("xxmytemplate") and job["metadata"]["labels"]["team"] == "vision"
        container = job["spec"]["taskRoles"][0]["task"]["pod"]["spec"]["containers"][0]
        assert container["image"] == "my.registry/vision:1.2" and container["command"][0] == "sh"
        assert job["spec"]["taskRoles"][0]["task"]["pod"]["spec"]["volumes"] == [
            {"name": "data", "persistentVolumeClaim": {"claimName": "nni-pvc"}}]  # the template's own volume
        assert (pvc_dir / "nni" / svc.experiment_id / "trials" / "Tmpl1" / "parameter.cfg").is_file()
    finally:
        svc.close()


def test_a_framework_template_is_checked_when_the_config_is_loaded(tmp_path):
    from trialflow.config import FrameworkControllerConfig

    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: Framework\nspec:\n  taskRoles:\n  - name: worker\n"
                   "    task: {pod: {spec: {containers: []}}}\n")
    with pytest.raises(ValueError, match="exactly one container"):
        FrameworkControllerConfig(trial_code_directory=tmp_path, config_path=bad, reuse_mode=False,
                                  storage={"storageType": "pvc", "path": str(tmp_path)})
    with pytest.raises(ValueError, match="claimName"):
        FrameworkControllerConfig(trial_code_directory=tmp_path, reuse_mode=False,
                                  storage={"storageType": "pvc", "path": str(tmp_path)},
                                  task_roles=[{"name": "w", "taskNumber": 1, "command": "true", "gpuNumber": 0,
                                               "cpuNumber": 1, "memorySize": "1gb", "frameworkAttemptCompletionPolicy":
                                               {"minFailedTaskCount": 1, "minSucceedTaskCount": 1}}])
