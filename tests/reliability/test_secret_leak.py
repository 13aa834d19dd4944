"""Secrets never leak: experiments run with sentinel passwords, tokens and passphrases, then the store,
every file they left (logs, trial directories, remote working directories, shared storage, pod and job
logs),
the Python log records and output of the run, and the Prefect API's flow runs (parameters, names, state
messages), task runs (names, inputs, states), artifacts and logs are scanned -- no sentinel may appear."""

from __future__ import annotations

import json
import logging
import subprocess
import traceback
from pathlib import Path

import pytest

from tests.conftest import (
    DLC_KEY_ID,
    DLC_KEY_SECRET,
    DLTS_PASSWORD,
    PAI_TOKEN,
    aml_section,
    base_config,
    dlc_section,
    dlts_section,
    k8s_section,
    machine,
    openpai_section,
    prefect_section,
    wait_for,
    write_trial,
)
from trialflow import run_experiment
from trialflow.testing.sshd import SSH_KEYGEN

PASSWORD = "SENTINEL-pw-7f3a9c1e"
PASSPHRASE = "SENTINEL-passphrase-b41d6e02"

TRIAL = """
import os, nni
p = nni.get_next_parameter()
token = os.environ.get("TRIALFLOW_METRICS_TOKEN")
if not token and os.environ.get("TRIALFLOW_METRICS_TOKEN_FILE"):  # platforms without a secret store
    with open(os.environ["TRIALFLOW_METRICS_TOKEN_FILE"]) as f:
        token = f.read().strip()
if token:  # kept out of every scanned place, to know what to look for
    with open(os.path.join({captured!r}, nni.get_trial_id() + ".token"), "w") as f:
        f.write(token)
nni.report_intermediate_result(p["x"])
nni.report_final_result(p["x"] * 2)
"""


ENDINGS = {"trialflow.experiment.done", "trialflow.experiment.failed", "trialflow.experiment.stopped"}


def _prefect_texts(experiment_id: str, ran_trials: bool = True) -> list[str]:
    """Everything the Prefect API holds about the experiment's flow run, as text."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        ArtifactFilterKey,
        FlowRunFilter,
        FlowRunFilterId,
        FlowRunFilterName,
        LogFilter,
        LogFilterFlowRunId,
    )
    from prefect.events.filters import EventAnyResourceFilter, EventFilter

    texts = []
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[experiment_id])))
        assert runs, f"no flow run named {experiment_id}"
        for run in runs:
            texts.append(run.model_dump_json())
            run_filter = FlowRunFilter(id=FlowRunFilterId(any_=[run.id]))
            # the server records task runs from events, a moment after they happen
            task_runs = client.read_task_runs(flow_run_filter=run_filter)
            if ran_trials:
                task_runs = wait_for(lambda f=run_filter: client.read_task_runs(flow_run_filter=f), timeout=30)
            texts += [task_run.model_dump_json() for task_run in task_runs]
            # the run's artifacts, wherever they are in the server's list
            texts += [artifact.model_dump_json() for artifact in client.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run.id])))]
            texts += [log.model_dump_json() for log in
                      client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])))]
        # and those keyed by the experiment (once: they belong to no one run)
        texts += [artifact.model_dump_json() for artifact in client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(like_=experiment_id)))
            if (artifact.key or "").endswith(experiment_id)]
        # trialflow's own events (trial ends, best trials), up to the experiment's end, the last one sent
        mine = EventFilter(any_resource=EventAnyResourceFilter(id=[f"trialflow.experiment.{experiment_id}"]))

        def up_to_the_end():
            page, events = client.read_events(mine, limit=50), []
            events += page.events
            while page.next_page:
                page = client.read_events_page(page.next_page)
                events += page.events
            return events if any(e.event in ENDINGS for e in events) else None

        texts += [event.model_dump_json() for event in wait_for(up_to_the_end, timeout=30)]
    return texts


def _files_containing(roots: list[Path], secrets: list[str], skip: set[Path]) -> list[str]:
    found = []
    needles = [s.encode() for s in secrets]
    for root in roots:
        for path in (p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
            if path in skip or any(parent in skip for parent in path.parents):
                continue
            data = path.read_bytes()
            found += [f"{path} holds {s}" for s, n in zip(secrets, needles, strict=True) if n in data]
    return found


def _assert_nowhere(secrets: list[str], roots: list[Path], skip: set[Path], texts: list[str]) -> None:
    assert all(secrets), "no sentinel to look for"
    assert _files_containing(roots, secrets, skip) == []
    leaks = [(s, t[:300]) for t in texts for s in secrets if s in t]
    assert leaks == []


@pytest.fixture
def scan_logs(caplog, capfd):
    """Every log record at DEBUG (Prefect's logging set-up raised the levels) plus the run's output."""
    for name in ("", "trialflow", "prefect", "paramiko", "kubernetes", "urllib3"):
        caplog.set_level(logging.DEBUG, logger=name)

    def texts() -> list[str]:
        out, err = capfd.readouterr()
        return [out, err, *(r.getMessage() for r in caplog.records), caplog.text]
    return texts


def test_ssh_passphrase_and_a_wrong_password_never_leak(tmp_path, prefect_server, sshd_servers, known_hosts,
                                                        scan_logs):
    server = sshd_servers[0]
    key = tmp_path / "keys" / "encrypted_key"
    key.parent.mkdir()
    subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", PASSPHRASE, "-f", str(key), "-C", "sentinel"],
                   check=True)
    authorized = server.directory / "authorized_keys"
    original = authorized.read_text()
    authorized.write_text(original + (key.with_suffix(".pub")).read_text())
    try:
        write_trial(tmp_path / "code", TRIAL.format(captured=str(tmp_path / "keys")))
        remote = tmp_path / "remote"
        good = {"platform": "remote", "knownHostsFile": str(known_hosts),
                "machineList": [machine(server, remote, sshKeyFile=str(key), sshPassphrase=PASSPHRASE)]}
        result = run_experiment(base_config(tmp_path / "code", tmp_path / "w", trialCommand="python3 trial.py",
                                            maxTrialNumber=2, trainingService=good))
        assert result.status == "DONE" and all(t.status == "SUCCEEDED" for t in result.trials)
        texts = _prefect_texts(result.experiment_id)

        bad_entry = machine(server, remote, password=PASSWORD)
        bad_entry.pop("sshKeyFile")
        bad = {**good, "machineList": [bad_entry]}
        with pytest.raises(Exception) as err:  # noqa: PT011 -- the message is checked below
            run_experiment(base_config(tmp_path / "code", tmp_path / "w", trialCommand="python3 trial.py",
                                       maxTrialNumber=1, trainingService=bad))
        assert "authentication failed" in str(err.value)
        texts.append("".join(traceback.format_exception(err.value)))
        failed_id = next(p.name for p in (tmp_path / "w").iterdir()
                         if p.name != result.experiment_id and (p / "db").is_dir())
        texts += _prefect_texts(failed_id, ran_trials=False)
    finally:
        authorized.write_text(original)
    _assert_nowhere([PASSWORD, PASSPHRASE], [tmp_path, server.directory], {key.parent, authorized},
                    texts + scan_logs())


def test_kubernetes_and_metrics_tokens_never_leak(tmp_path, prefect_server, k8s_emulator, scan_logs, monkeypatch):
    from trialflow.blocks.kubernetes import KubernetesCredentials

    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.kube/config to fall back on
    kubeconfig = k8s_emulator.write_kubeconfig(tmp_path / "secret" / "kubeconfig")
    KubernetesCredentials(kubeconfig=kubeconfig.read_text()).save("sentinel-cluster", overwrite=True)
    kubeconfig.unlink()
    captured = tmp_path / "secret"
    nfs = k8s_emulator.nfs_dir
    code = tmp_path / "code"
    write_trial(code, TRIAL.format(captured=str(captured)), name="trial.py")
    service = {**k8s_section("tfjob", nfs, command="python3 trial.py"), "credentials": "sentinel-cluster"}
    result = run_experiment(base_config(code, tmp_path / "w", maxTrialNumber=2, trainingService=service))
    assert result.status == "DONE" and all(t.status == "SUCCEEDED" for t in result.trials), \
        [(t.status, t.message) for t in result.trials]
    metric_tokens = [p.read_text() for p in captured.glob("*.token")]
    assert len(metric_tokens) == 2, "the trials got no metrics token"
    pod_logs = [Path(k8s_emulator.directory)]
    _assert_nowhere([k8s_emulator.token, *metric_tokens], [tmp_path, nfs, *pod_logs], {captured},
                    _prefect_texts(result.experiment_id) + scan_logs())


def test_openpai_dlts_and_dlc_secrets_and_metrics_tokens_never_leak(tmp_path, prefect_server, openpai_emulator,
                                                                    dlts_emulator, dlc_emulator, scan_logs):
    from trialflow.blocks import DLTSCredentials, OpenPAICredentials, PAIDLCCredentials

    OpenPAICredentials(username="alice", token=PAI_TOKEN).save("sentinel-pai", overwrite=True)
    DLTSCredentials(email="alice@example.org", password=DLTS_PASSWORD).save("sentinel-dlts", overwrite=True)
    PAIDLCCredentials(access_key_id=DLC_KEY_ID, access_key_secret=DLC_KEY_SECRET).save("sentinel-dlc",
                                                                                        overwrite=True)
    captured = tmp_path / "secret"
    captured.mkdir()
    code = tmp_path / "code"
    write_trial(code, TRIAL.format(captured=str(captured)), name="trial.py")
    pai = {k: v for k, v in openpai_section(openpai_emulator, reuse=True).items() if k not in ("username", "token")}
    dlts = {k: v for k, v in dlts_section(dlts_emulator).items() if k not in ("email", "password")}
    dlc = {k: v for k, v in dlc_section(dlc_emulator).items() if k not in ("accessKeyId", "accessKeySecret")}
    dlc_emulator.fail_next(2, 503, method="POST")  # errors echoing signed requests are scrubbed too
    texts, bodies = [], []
    for service in ({**pai, "credentials": "sentinel-pai"}, {**dlts, "credentials": "sentinel-dlts"},
                    {**dlc, "credentials": "sentinel-dlc"}):
        result = run_experiment(base_config(code, tmp_path / "w", trialCommand="python3 trial.py", maxTrialNumber=2,
                                            trainingService=service))
        assert result.status == "DONE" and all(t.status == "SUCCEEDED" for t in result.trials), \
            [(t.status, t.message) for t in result.trials]
        texts += _prefect_texts(result.experiment_id)
    bodies += [yaml_text for yaml_text in (j.text for j in openpai_emulator.jobs.values())]
    bodies += [json.dumps(j.params) for j in dlts_emulator.jobs.values()]
    bodies += [json.dumps(j.body) for j in dlc_emulator.jobs.values()]
    metric_tokens = [p.read_text() for p in captured.glob("*.token")]
    assert len(metric_tokens) == 6, "the trials got no metrics token"
    roots = [tmp_path, openpai_emulator.directory, openpai_emulator.storage_dir, dlts_emulator.directory,
             dlts_emulator.work_dir, dlc_emulator.directory, dlc_emulator.nas_dir]
    _assert_nowhere([PAI_TOKEN, DLTS_PASSWORD, DLC_KEY_ID, DLC_KEY_SECRET, *metric_tokens], roots, {captured},
                    texts + bodies + scan_logs())


def test_azure_ml_tokens_and_metrics_tokens_never_leak(tmp_path, prefect_server, aml_emulator, scan_logs):
    from trialflow.blocks import AzureMLCredentials

    AzureMLCredentials(managed_identity=True).save("sentinel-aml", overwrite=True)
    captured = tmp_path / "secret"
    captured.mkdir()
    code = tmp_path / "code"
    write_trial(code, TRIAL.format(captured=str(captured)), name="trial.py")
    aml_emulator.fail_next(2, 503, method="PUT", path="/jobs/")  # errors of the SDK are scrubbed too
    service = {**aml_section(aml_emulator), "credentials": "sentinel-aml"}
    result = run_experiment(base_config(code, tmp_path / "w", trialCommand="python3 trial.py", maxTrialNumber=2,
                                        trainingService=service))
    assert result.status == "DONE" and all(t.status == "SUCCEEDED" for t in result.trials), \
        [(t.status, t.message) for t in result.trials]
    metric_tokens = [p.read_text() for p in captured.glob("*.token")]
    assert len(metric_tokens) == 2, "the trials got no metrics token"
    bodies = [json.dumps(j.body) for j in aml_emulator.jobs.values()]
    _assert_nowhere([aml_emulator.token, aml_emulator.identity_header, *metric_tokens],
                    [tmp_path, aml_emulator.directory, aml_emulator.datastore_dir], {captured},
                    _prefect_texts(result.experiment_id) + bodies + scan_logs())


def test_work_pool_metrics_tokens_stay_in_secret_blocks(tmp_path, on_pool, scan_logs):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName, LogFilter, LogFilterFlowRunId

    captured = tmp_path / "secret"
    captured.mkdir()
    code = tmp_path / "code"
    write_trial(code, TRIAL.format(captured=str(captured)), name="trial.py")
    result = run_experiment(base_config(code, tmp_path / "w", trialCommand="python3 trial.py", maxTrialNumber=2,
                                        trainingService=prefect_section(on_pool)))
    assert result.status == "DONE" and all(t.status == "SUCCEEDED" for t in result.trials), \
        [(t.status, t.message) for t in result.trials]
    metric_tokens = [p.read_text() for p in captured.glob("*.token")]
    assert len(metric_tokens) == 2, "the trials got no metrics token"
    # task runs reach a server as events, through a client made for the session's other server: the
    # flow run, its artifacts and logs are read here, and the trials' runs below
    texts = _prefect_texts(result.experiment_id, ran_trials=False)
    with get_client(sync_client=True) as client:  # the trials' own flow runs on the pool, and their logs
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            name=FlowRunFilterName(like_=f"nni_exp_{result.experiment_id}_")))
        assert len(runs) == 2
        texts += [run.model_dump_json() for run in runs]
        texts += [log.model_dump_json() for log in client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[r.id for r in runs])))]
        texts += [doc.model_dump_json() for doc in client.read_block_documents(include_secrets=False)]
    _assert_nowhere(metric_tokens, [tmp_path, on_pool.share_dir, on_pool.home], {captured}, texts + scan_logs())


def test_a_store_url_password_never_leaks(tmp_path, prefect_server, postgres_server, scan_logs):
    """A shared store's password (real PostgreSQL): not in the experiment folder (db/store-url holds the URL
    without it, 0600), not in the stored config, not in Prefect, not in the logs or output."""
    import yaml

    from trialflow.experiments import open_store

    code = tmp_path / "code"
    write_trial(code, "import nni\np = nni.get_next_parameter()\nnni.report_final_result(p['x'])\n")
    url = postgres_server.url.replace("@", f":{PASSWORD}@", 1)
    config = tmp_path / "config.yml"  # the user's own file, which holds it
    config.write_text(yaml.safe_dump(base_config(code, tmp_path / "w", maxTrialNumber=2, storeUrl=url)))
    result = run_experiment(config)
    assert result.status == "DONE" and len(result.trials) == 2
    store_url = result.directory / "db" / "store-url"
    assert store_url.stat().st_mode & 0o777 == 0o600
    store = open_store(result.directory.parent, result.experiment_id)
    stored = json.dumps(store.experiment().config) + json.dumps([t.__dict__ for t in store.trials()], default=str)
    _assert_nowhere([PASSWORD], [tmp_path / "w", code], set(),
                    [stored, *_prefect_texts(result.experiment_id), *scan_logs()])


def test_a_shared_storage_account_key_never_leaks(tmp_path, prefect_server, scan_logs, monkeypatch):
    """sharedStorage's AzureBlob key with nnimount: only in blobfuse's own 0600 config file, deleted after
    the mount; nowhere in the experiment, the share, Prefect, the logs or output."""
    from tests.test_shared_storage import _blob_share, _stand_in_blobfuse

    kept = tmp_path / "blobfuse-config"
    # blobfuse here keeps a copy of its config file outside every scanned place, to know it was given the key
    _stand_in_blobfuse(tmp_path, monkeypatch, f'cfg="${{3#--config-file=}}"; cp "$cfg" {kept}\n')
    code = tmp_path / "code"
    write_trial(code, "import nni\np = nni.get_next_parameter()\nnni.report_final_result(p['x'])\n")
    (tmp_path / "blob").mkdir()
    share = {**_blob_share(tmp_path / "blob"), "storageAccountKey": PASSWORD}
    result = run_experiment(base_config(code, tmp_path / "w", sharedStorage=share, maxTrialNumber=2))
    assert result.status == "DONE"
    assert f"accountKey {PASSWORD}" in kept.read_text()  # blobfuse got it
    _assert_nowhere([PASSWORD], [tmp_path / "w", tmp_path / "blob", tmp_path / "tmp", code], set(),
                    [*_prefect_texts(result.experiment_id), *scan_logs()])


def test_an_mlflow_login_never_leaks(tmp_path, prefect_server, mlflow_server, scan_logs, monkeypatch):
    """The MLflow tracking server's password (a real server with basic authentication), saved in a block:
    not in the experiment folder, the trials' environment or output, Prefect, the logs, or anything the
    experiment logged to MLflow (tags, parameters, artifacts)."""
    import uuid

    from mlflow import MlflowClient

    from trialflow.blocks import MLflowCredentials

    MLflowCredentials(username="admin", password=mlflow_server.password).save("sentinel-mlflow")
    code = tmp_path / "code"
    write_trial(code, "import os, nni\nnni.get_next_parameter()\nprint(dict(os.environ))\nnni.report_final_result(1)\n")
    name = f"leak-{uuid.uuid4().hex[:8]}"
    result = run_experiment(base_config(code, tmp_path / "w", maxTrialNumber=2, tracking={"mlflow": {
        "trackingUri": mlflow_server.uri, "experimentName": name, "credentials": "sentinel-mlflow"}}))
    assert result.status == "DONE"
    for key, value in mlflow_server.login.items():
        monkeypatch.setenv(key, value)
    client = MlflowClient(tracking_uri=mlflow_server.uri)
    runs = client.search_runs([client.get_experiment_by_name(name).experiment_id])
    assert len(runs) == 3  # the experiment and its two trials were logged with the login
    logged = tmp_path / "logged"
    for run in runs:
        client.download_artifacts(run.info.run_id, "", str(logged / run.info.run_id))
    assert any(logged.rglob("trial.stdout"))  # the trials' output (their environment) was scanned
    _assert_nowhere([mlflow_server.password], [tmp_path / "w", logged], set(),
                    [json.dumps([r.to_dictionary() for r in runs]), *_prefect_texts(result.experiment_id),
                     *scan_logs()])


def test_a_wandb_key_never_leaks(tmp_path, prefect_server, scan_logs):
    """A W&B API key saved in a block, for an online W&B (a loopback one that refuses it): sent to W&B
    only, not in the experiment folder (W&B's own run files and logs included), the trials'
    environment or output, Prefect or the logs."""
    from tests.test_tracking_wandb import key_was_sent, refusing_wandb

    code = tmp_path / "code"
    write_trial(code, "import os, nni\nnni.get_next_parameter()\nprint(dict(os.environ))\nnni.report_final_result(1)\n")
    with refusing_wandb("sentinel-wandb") as (key, seen):
        result = run_experiment(base_config(code, tmp_path / "w", maxTrialNumber=2, tracking={"wandb": {
            "project": "leak", "mode": "online", "credentials": "sentinel-wandb"}}))
    assert result.status == "DONE" and key_was_sent(key, seen)
    assert any((tmp_path / "w").rglob("trial.stdout")) and any((tmp_path / "w").rglob("debug-internal.log"))
    _assert_nowhere([key], [tmp_path / "w"], set(), [*_prefect_texts(result.experiment_id), *scan_logs()])
