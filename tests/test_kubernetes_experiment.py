"""Experiments end to end on the Kubernetes services (API emulator, Prefect test server): 6 trials at
concurrency 3 on TFJob, PyTorchJob, Framework and AdaptDLJob, reuse on and off, metrics over HTTP
and only through pod logs; controller SIGKILL and resume re-attach running jobs."""

from __future__ import annotations

import pytest
import yaml

from tests.conftest import base_config, k8s_section, run_until_running_then_sigkill, start_controller
from tests.test_remote_experiment import TRIAL, _events, _peak
from trialflow import parse_config, run_experiment
from trialflow.experiments import open_store
from trialflow.testing.contract import RESUMING_TRIAL

pytestmark = pytest.mark.usefixtures("prefect_server")


def k8s_experiment(tmp_path, k8s, kind, reuse=False, channel="http", sleep=0.1, **overrides):
    from tests.conftest import write_trial

    write_trial(tmp_path / "code", TRIAL.format(log=str(tmp_path / "events.jsonl"), sleep=sleep))
    section = k8s_section(kind, k8s.nfs_dir, reuse, channel, command="python3 trial.py")
    return base_config(tmp_path / "code", tmp_path / "w", trialCommand="python3 trial.py", trainingService=section,
                       **overrides)


def _check_done(tmp_path, result_or_store, trials, count):
    assert len(trials) == count and all(t.status == "SUCCEEDED" for t in trials), [t.status for t in trials]
    for trial in trials:
        periodical = [m.value for m in result_or_store.metrics(trial.id, "PERIODICAL")]
        assert periodical == [pytest.approx(trial.parameters["x"] + i) for i in range(3)]
        assert trial.final == pytest.approx(trial.parameters["x"] * 10)
    starts = [e["trial"] for e in _events(tmp_path) if e["kind"] == "start"]
    assert sorted(starts) == sorted(t.id for t in trials), "a trial ran twice or not at all"


@pytest.mark.parametrize("kind,reuse,channel", [
    ("tfjob", False, "http"), ("pytorchjob", False, "http"), ("framework", False, "http"), ("adaptdl", False, "http"),
    ("tfjob", True, "http"), ("framework", True, "http"), ("tfjob", False, "logs"), ("framework", False, "logs"),
], ids=["tfjob", "pytorchjob", "framework", "adaptdl", "tfjob-reuse", "framework-reuse", "tfjob-logs-only",
        "framework-logs-only"])
def test_six_trials_at_concurrency_three(tmp_path, k8s, kind, reuse, channel):
    config = k8s_experiment(tmp_path, k8s, kind, reuse, channel, trialConcurrency=3, maxTrialNumber=6)
    result = run_experiment(config)
    assert result.status == "DONE"
    store = open_store(tmp_path / "w", result.experiment_id)
    _check_done(tmp_path, store, result.trials, 6)
    assert _peak(_events(tmp_path)) <= 3
    jobs = {"tfjob": "tfjobs", "pytorchjob": "pytorchjobs", "framework": "frameworks", "adaptdl": "adaptdljobs"}[kind]
    mine = [j for j in k8s.objects(jobs) if j["metadata"]["labels"].get("expId") == result.experiment_id]
    if reuse:
        assert mine == []  # environments are deleted at the end
        envs = list((k8s.nfs_dir / "nni" / result.experiment_id / "envs").iterdir())
        assert 1 <= len(envs) <= 3  # never more environments than trials in flight
    else:
        assert len(mine) == 6
    receiver_file = tmp_path / "w" / result.experiment_id / "metrics-receiver.json"
    assert receiver_file.exists() == (channel == "http")


@pytest.mark.parametrize("kind,reuse", [("tfjob", False), ("framework", True)], ids=["tfjob", "framework-reuse"])
def test_controller_sigkill_and_resume_reattaches_running_jobs(tmp_path, k8s, prefect_server, kind, reuse):
    """The resumed controller meets the API failing: re-attaching reads each trial's token, and the
    first of those reads are answered 503 or dropped -- retried, the trials go on, none is cancelled."""
    config = parse_config(k8s_experiment(tmp_path, k8s, kind, reuse, sleep=1.0, trialConcurrency=2,
                                         maxTrialNumber=4))
    exp_id, exp_dir, store = run_until_running_then_sigkill(config, prefect_server)
    k8s.fail_next(1, 503, method="GET", path="/secrets/.+-token")
    k8s.drop_next(1, method="GET", path="/secrets/.+-token")
    second = start_controller(exp_id, exp_dir.parent, prefect_server)
    assert second.wait(timeout=180) == 0
    assert store.experiment().status == "DONE"
    _check_done(tmp_path, store, store.trials(), 4)


def test_a_code_directory_holding_trialflow_s_folders_and_the_share_s_mount_uploads_none_of_them(tmp_path,
                                                                                                   monkeypatch):
    """A project folder that is also the code directory and holds the experiments folder (records,
    logs being written), the kept server's folder (its auth string) and the mount of the cluster's NFS
    share (other files on it, and the bundles written there): the bundle leaves all three out, and the
    experiment runs (seen by hand before: it ended ERROR, its bundle's checksum mismatched)."""
    from tests.conftest import NFS_PATH, NFS_SERVER, write_trial
    from trialflow.server.kept_server import server_home
    from trialflow.testing.emulators.kubernetes import KubernetesEmulator

    project = tmp_path / "project"
    write_trial(project, f"# {project}\nimport nni\np = nni.get_next_parameter()\nnni.report_final_result(p['x'])\n")
    monkeypatch.setenv("TRIALFLOW_HOME", str(project / "tf-home"))
    server_home().mkdir(parents=True)
    (server_home() / "auth").write_text("kept-server-auth-string")
    share = project / "share"
    (share / "someone-else").mkdir(parents=True)
    (share / "someone-else" / "data.bin").write_bytes(b"not for this experiment")
    emulator = KubernetesEmulator(tmp_path / "cluster", {f"{NFS_SERVER}:{NFS_PATH}": share}, kill_grace=1.0).start()
    try:
        monkeypatch.setenv("KUBECONFIG", str(emulator.write_kubeconfig(tmp_path / "kubeconfig")))
        config = base_config(project, project / "runs", maxTrialNumber=2,
                             trainingService=k8s_section("tfjob", share, command="python3 trial.py"))
        result = run_experiment(config)
    finally:
        emulator.stop()
    assert result.status == "DONE" and all(t.status == "SUCCEEDED" for t in result.trials)
    [bundle] = [b for b in (share / "nni" / "code").iterdir() if b.is_dir()]
    assert sorted(p.name for p in bundle.iterdir()) == ["trial.py"]


def test_file_metric_channel_end_to_end_and_log_trial_of_a_kubernetes_trial(tmp_path, k8s):
    import os
    import subprocess

    config = k8s_experiment(tmp_path, k8s, "tfjob", False, "file", trialConcurrency=2, maxTrialNumber=2)
    with open(tmp_path / "code" / "trial.py", "a") as f:
        f.write('print("hello from the pod, x =", p["x"])\n')
    result = run_experiment(config)
    assert result.status == "DONE"
    store = open_store(tmp_path / "w", result.experiment_id)
    _check_done(tmp_path, store, result.trials, 2)
    assert not (tmp_path / "w" / result.experiment_id / "metrics-receiver.json").exists()  # no HTTP receiver
    trial = result.trials[0]
    shown = subprocess.run(["trialflow", "log", "trial", result.experiment_id, trial.id, "--root",
                            str(tmp_path / "w")], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "KUBECONFIG": str(k8s.kubeconfig)})
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert f"hello from the pod, x = {trial.parameters['x']}" in shown.stdout

    # nnictl platform clean on cluster storage: trialflow's folders on the share go (they come back when
    # needed), anything else there and the experiment here stay
    share = k8s.nfs_dir / "nni"
    assert (share / result.experiment_id / "trials").is_dir() and (share / "code").is_dir()
    (share / "someone-elses").mkdir(exist_ok=True)
    (share / "abcd1234" / "trials").mkdir(parents=True, exist_ok=True)  # named and shaped like trialflow's
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(config))
    clean = subprocess.run(["trialflow", "platform", "clean", "-c", str(path), "-y"], capture_output=True, text=True,
                           timeout=120, env={**os.environ, "KUBECONFIG": str(k8s.kubeconfig)})
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert not (share / result.experiment_id).exists() and not (share / "code").exists()
    assert not (share / "runtime").exists() and (share / "someone-elses").is_dir()
    assert (share / "abcd1234" / "trials").is_dir()  # not marked as trialflow's: not removed
    assert (tmp_path / "w" / result.experiment_id / "db").is_dir()


def test_nnis_role_only_framework_config_runs_each_trial_in_its_own_job(tmp_path, k8s):
    """NNI's documented FrameworkController example: task roles with their command, no trialCommand and
    no reuseMode. It runs as NNI ran it: one Framework per trial, the role's command in it."""
    config = k8s_experiment(tmp_path, k8s, "framework", trialConcurrency=2, maxTrialNumber=3)
    del config["trialCommand"], config["trainingService"]["reuseMode"]
    config["trainingService"]["taskRoles"][0]["command"] = "python3 trial.py"
    with pytest.warns(UserWarning, match="no trialCommand"):
        result = run_experiment(config)
    assert result.status == "DONE"
    _check_done(tmp_path, open_store(tmp_path / "w", result.experiment_id), result.trials, 3)
    mine = [j for j in k8s.objects("frameworks") if j["metadata"]["labels"].get("expId") == result.experiment_id]
    assert len(mine) == 3 and not (k8s.nfs_dir / "nni" / result.experiment_id / "envs").exists()


def _preempt_when_paused(k8s, stop, preempted):
    """The test's scheduler: preempts the pod of the trial that says it paused (once), and appends the
    pod's name to ``preempted`` (or what stopped it from preempting, so the test can say why)."""
    try:
        _preempt_paused(k8s, stop, preempted)
    except Exception as exc:  # noqa: BLE001 -- said by the test, not lost in a thread
        preempted.append(f"the test's scheduler failed: {exc!r}")


def _preempt_paused(k8s, stop, preempted):
    import time

    from trialflow.foundation.ids import lowercase_id

    while not stop.is_set():
        for paused in k8s.nfs_dir.glob("nni/*/trials/*/checkpoint/paused"):
            trial_id = paused.parent.parent.name
            jobs = [j["metadata"]["name"] for j in k8s.objects("tfjobs")
                    if j["metadata"]["labels"].get("trialId") == lowercase_id(trial_id)]
            pods = [p["metadata"]["name"] for p in k8s.objects("pods") if p["status"]["phase"] == "Running"
                    and p["metadata"]["ownerReferences"][0]["name"] in jobs]
            if pods:
                k8s.disrupt(pods[0], reason="PreemptionByScheduler", message="Preempted by pod urgent-1 on node n1")
                paused.unlink()
                preempted.append(pods[0])
                return
        time.sleep(0.05)


def test_a_preempted_trial_runs_again_from_its_checkpoint_and_is_no_failure(tmp_path, k8s):
    """A pod preempted mid-run: the trial runs again as a new job with the same parameters, resumes
    from its checkpoint folder, its intermediate results numbered on (0..5, each once), and succeeds;
    the preemption is an event of the trial, not a trial of the budget, and ``trial ls`` shows runs."""
    import os
    import subprocess
    import threading

    from tests.conftest import write_trial

    write_trial(tmp_path / "code", RESUMING_TRIAL)
    section = k8s_section("tfjob", k8s.nfs_dir, command="python3 trial.py")
    config = base_config(tmp_path / "code", tmp_path / "w", trialCommand="python3 trial.py", trainingService=section,
                         trialConcurrency=2, maxTrialNumber=3)
    stop, preempted = threading.Event(), list[str]()
    scheduler = threading.Thread(target=_preempt_when_paused, args=(k8s, stop, preempted), daemon=True)
    scheduler.start()
    try:
        result = run_experiment(config)
    finally:
        stop.set()
        scheduler.join()
    assert len(preempted) == 1 and preempted[0].endswith("-worker-0"), preempted
    assert result.status == "DONE" and len(result.trials) == 3
    assert all(t.status == "SUCCEEDED" for t in result.trials), [(t.status, t.message) for t in result.trials]
    store = open_store(tmp_path / "w", result.experiment_id)
    [first] = [t for t in result.trials if t.sequence == 0]
    from trialflow.foundation.ids import lowercase_id

    assert first.handle["data"]["attempt"] == 1  # a job of its own for the second run
    assert first.handle["data"]["job"].endswith("-trial-" + lowercase_id(first.id + "r1"))
    periodical = store.metrics(first.id, "PERIODICAL")
    assert [(m.sequence, m.value) for m in periodical] == [(i, pytest.approx(first.parameters["x"] + i))
                                                           for i in range(6)]
    notes = [message for _, _, message in store.status_history(first.id) if message and "interrupted" in message]
    job = first.handle["data"]["job"].removesuffix(lowercase_id(first.id + "r1")) + lowercase_id(first.id)
    # whichever the poll meets first tells it: the preempted pod's own condition (a poll before the
    # operator replaced the pod), the operator's Restarting condition, or the keeper's record of the stop
    # (the pod's keeper passes SIGTERM on to the trial, which may end first)
    preempted = (f"run again as attempt 1: pod {job}-worker-0 was preempted by a higher-priority pod "
                 "(PreemptionByScheduler: Preempted by pod urgent-1 on node n1)")
    stopped = f"run again as attempt 1: job {job}: Kubernetes stopped the trial's pod"
    assert len(notes) == 1 and (preempted in notes[0] or stopped in notes[0] and (
        "restarting because 1 Worker replica(s) failed" in notes[0]
        or "a stop signal trialflow did not send ended its run" in notes[0])), notes
    # the Prefect UI: the trial's task run says how many runs it took
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterName

    from tests.conftest import wait_for

    def task_run_message():
        with get_client(sync_client=True) as client:
            runs = client.read_task_runs(task_run_filter=TaskRunFilter(name=TaskRunFilterName(
                any_=[f"trial-{first.id}"])))
        return runs[0].state.message if runs and runs[0].state and runs[0].state.is_final() else None

    assert wait_for(task_run_message, timeout=30) == f"trial {first.id} succeeded (2 runs: 1 interrupted)"
    shown = subprocess.run(["trialflow", "trial", "ls", result.experiment_id, "--root", str(tmp_path / "w")],
                           capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert shown.returncode == 0, shown.stdout + shown.stderr
    header = next(line for line in shown.stdout.splitlines() if "status" in line)
    row = next(line for line in shown.stdout.splitlines() if first.id in line)
    assert "runs" in header and row.split()[header.split().index("runs")] == "2", shown.stdout
