"""NNI's Python API (``from nni.experiment import Experiment``), as NNI's quickstart and notebooks use it:
scripts run as a user runs them (``python script.py``, ``nni`` found through the installed shim), on
real trials."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import PYTHON, wait_for, write_trial
from trialflow.config import ConfigError, parse_config
from trialflow.config.nni_objects import (
    AlgorithmConfig,
    CustomAlgorithmConfig,
    ExperimentConfig,
    LocalConfig,
    RemoteConfig,
    RemoteMachineConfig,
)
from trialflow.experiments import open_store
from trialflow.records.store_records import config_in_force

TRIAL = """\
import os, time, nni
p = nni.get_next_parameter()
while os.path.exists({hold!r}):
    time.sleep(0.1)
nni.report_intermediate_result(p["x"])
nni.report_final_result(p["x"] * 10)
"""


def _quickstart(tmp_path: Path, body: str, max_trials: int = 4, hold: Path | None = None) -> str:
    """NNI's HPO quickstart (its main.py), with this test's trial and working directory, then ``body``."""
    write_trial(tmp_path / "code", TRIAL.format(hold=str(hold or tmp_path / "no-hold")), name="model.py")
    return textwrap.dedent(f"""\
        import json
        search_space = {{'x': {{'_type': 'uniform', '_value': [0, 1]}},
                        'unused': {{'_type': 'choice', '_value': [1, 2]}}}}
        from nni.experiment import Experiment
        experiment = Experiment('local')
        experiment.config.trial_command = '{PYTHON} model.py'
        experiment.config.trial_code_directory = 'code'
        experiment.config.search_space = search_space
        experiment.config.tuner.name = 'TPE'
        experiment.config.tuner.class_args['optimize_mode'] = 'maximize'
        experiment.config.max_trial_number = {max_trials}
        experiment.config.trial_concurrency = 2
        experiment.config.experiment_working_directory = {str(tmp_path / "w")!r}
        """) + textwrap.dedent(body)


def _python(tmp_path: Path, script: str, timeout: float = 180) -> subprocess.CompletedProcess:
    path = tmp_path / "main.py"
    path.write_text(script)
    return subprocess.run([sys.executable, str(path)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=timeout)


def test_nni_quickstart_config_objects_give_the_v2_config_nni_reads():
    """What NNI's quickstart sets on ``Experiment('local').config`` is the config NNI's YAML would be;
    the tuner, assessor and advisor placeholders NNI makes are left out when no one named them."""
    config = ExperimentConfig("local")
    config.trial_command = "python model.py"
    config.trial_code_directory = "."
    config.search_space = {"lr": {"_type": "loguniform", "_value": [0.0001, 0.1]}}
    config.tuner.name = "TPE"
    config.tuner.class_args["optimize_mode"] = "maximize"
    config.max_trial_number = 10
    config.trial_concurrency = 2
    config.training_service.use_active_gpu = False
    assert (config.max_experiment_duration, config.use_annotation, config.assessor.name) == (None, False, None)
    assert config.json() == {
        "trainingService": {"platform": "local", "useActiveGpu": False}, "trialCommand": "python model.py",
        "trialCodeDirectory": ".", "searchSpace": {"lr": {"_type": "loguniform", "_value": [0.0001, 0.1]}},
        "tuner": {"name": "TPE", "classArgs": {"optimize_mode": "maximize"}}, "maxTrialNumber": 10,
        "trialConcurrency": 2}
    parsed = parse_config(config.json())
    assert parsed.tuner is not None and parsed.tuner.name == "TPE" and parsed.assessor is None

    keyword = ExperimentConfig(search_space={}, trial_concurrency=1, trial_command="t", training_service=[
        LocalConfig(), RemoteConfig(machine_list=[RemoteMachineConfig(host="gpu1", user="me", ssh_key_file="~/k")])],
        tuner=AlgorithmConfig(name="Random"), assessor=CustomAlgorithmConfig(class_name="mine.Stop"))
    assert keyword.json()["trainingService"] == [{"platform": "local"}, {
        "platform": "remote", "machineList": [{"host": "gpu1", "user": "me", "sshKeyFile": "~/k"}]}]
    assert keyword.json()["assessor"] == {"className": "mine.Stop", "codeDirectory": ".", "classArgs": {}}

    remote = ExperimentConfig("remote", search_space={"x": {"_type": "uniform", "_value": [0, 1]}}, trial_command="t",
                              trial_concurrency=2, tuner=AlgorithmConfig(name="Random"))
    remote.training_service.machine_list.append(RemoteMachineConfig(host="gpu2", user="me", password="hunter2"))
    assert parse_config(remote.json()).training_service.machine_list[0].host == "gpu2"  # NNI's remote example
    assert "hunter2" not in repr(remote) and "password=**********" in repr(remote)  # a notebook's echo of it


def test_a_misspelt_field_set_on_nni_config_is_named_when_the_experiment_starts():
    config = ExperimentConfig("local", search_space={}, trial_command="t")
    config.trial_concurency = 2  # as a user mistypes it
    with pytest.raises(ConfigError) as caught:
        parse_config(config.json())
    assert "trialConcurency" in str(caught.value) and "trialConcurrency" in str(caught.value)


def test_nni_quickstart_runs_to_its_end_and_its_queries_read_the_record(tmp_path, prefect_server):
    """NNI's quickstart script: ``run()`` returns True at DONE; ``export_data``, ``get_job_metrics``,
    ``list_trial_jobs`` and ``get_experiment_profile`` give what the trials reported; ``stop()`` after the
    end changes nothing; its id cannot name a second new experiment."""
    out = _python(tmp_path, _quickstart(tmp_path, """\
        print("RUN", experiment.run(8080))
        experiment.stop()
        try:
            Experiment(experiment.config, id=experiment.id).run()
        except Exception as exc:
            print("AGAIN", exc)
        print("RESULT", json.dumps({
            "id": experiment.id, "status": experiment.get_status(),
            "export": [[r.trialJobId, r.parameter, r.value] for r in experiment.export_data()],
            "metrics": {k: [[m.type, m.data] for m in v] for k, v in experiment.get_job_metrics().items()},
            "jobs": [[j.trialJobId, j.status, j.hyperParameters[0].parameters, [m.data for m in j.finalMetricData]]
                     for j in experiment.list_trial_jobs()],
            "profile": experiment.get_experiment_profile(), "statistics": experiment.get_job_statistics(),
            "metadata": experiment.get_experiment_metadata(experiment.id),
            "all": [m["id"] for m in experiment.get_all_experiments_metadata()]}))
        """))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "RUN True" in out.stdout.splitlines()
    result = json.loads(out.stdout.split("RESULT ", 1)[1])
    assert (f"AGAIN experiment {result['id']} exists already: Experiment(None, id={result['id']!r}).resume() goes on "
            "with it; leave id out for a new one") in out.stdout.splitlines()
    store = open_store(tmp_path / "w", result["id"])
    trials = store.trials()
    assert result["status"] == store.experiment().status == "DONE" and len(trials) == 4
    assert sorted(result["export"]) == sorted([t.id, t.parameters, pytest.approx(t.parameters["x"] * 10)]
                                              for t in trials)
    assert result["metrics"] == {t.id: [["PERIODICAL", pytest.approx(t.parameters["x"])],
                                        ["FINAL", pytest.approx(t.parameters["x"] * 10)]] for t in trials}
    assert result["jobs"] == [[t.id, "SUCCEEDED", t.parameters, [pytest.approx(t.parameters["x"] * 10)]]
                              for t in trials]
    profile = result["profile"]
    assert profile["params"]["maxTrialNumber"] == 4 and profile["params"]["tuner"]["name"] == "TPE"
    assert profile["logDir"] == str(tmp_path / "w" / result["id"]) and profile["endTime"] >= profile["startTime"]
    assert result["statistics"] == [{"trialJobStatus": "SUCCEEDED", "trialJobNumber": 4}]
    metadata = result["metadata"]
    assert (metadata["status"], metadata["platform"], metadata["logDir"], metadata["pid"]) == (
        "DONE", "local", profile["logDir"], None)
    assert result["id"] in result["all"]


def test_an_experiment_started_in_the_background_stops_with_its_script_as_nni_does(tmp_path, prefect_server):
    """``start()`` returns while the trials run (``get_status`` RUNNING, changes reach the running
    controller, ``connect(port)`` finds it, ``view()`` names its run's page); when the script ends without
    ``stop()``, the experiment is stopped, as NNI stops its manager at exit; ``Experiment(None, id=...)``
    then reads it, and ``resume()`` runs it to its end."""
    hold = tmp_path / "hold"
    hold.touch()
    out = _python(tmp_path, _quickstart(tmp_path, """\
        import time
        experiment.start(8080)
        deadline = time.monotonic() + 120
        while [j.status for j in experiment.list_trial_jobs()] != ["RUNNING"] * 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        print("STATUS", experiment.get_status(), experiment.id)
        experiment.update_max_trial_number(3)
        import os, urllib.parse
        port = urllib.parse.urlsplit(os.environ["PREFECT_API_URL"]).port
        print("CONNECTED", Experiment.connect(port).id)
        experiment.view()
        """, hold=hold))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    status, exp_id = out.stdout.split("STATUS ", 1)[1].split()[:2]
    assert status == "RUNNING"
    assert f"experiment {exp_id} started in the background" in out.stdout
    assert f"CONNECTED {exp_id}" in out.stdout.splitlines()  # the one running experiment on the server's port
    page = out.stdout.split("  Prefect UI: ", 1)[1].split()[0]  # as start() printed it
    assert page.startswith(prefect_server.removesuffix("/api")) and "/runs/flow-run/" in page
    assert f"experiment {exp_id} RUNNING; Prefect UI: {page}" in out.stdout.splitlines()
    store = open_store(tmp_path / "w", exp_id)
    assert store.experiment().status == "STOPPED"  # stopped at the script's exit
    assert {t.status for t in store.trials()} == {"USER_CANCELED"}
    assert config_in_force(store.experiment())[0]["maxTrialNumber"] == 3
    hold.unlink()
    again = _python(tmp_path, textwrap.dedent(f"""\
        from nni.experiment import Experiment
        experiment = Experiment(None, id={exp_id!r})
        print("RESUMED", experiment.resume())
        print("STATUS", experiment.get_status(), len(experiment.export_data()))
        """))
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    # counts kept: the two stopped trials are two of the three, and one more ran and finished
    assert "RESUMED True" in again.stdout.splitlines() and "STATUS DONE 1" in again.stdout.splitlines()
    assert sorted(t.status for t in store.trials()) == ["SUCCEEDED", "USER_CANCELED", "USER_CANCELED"]


def test_nnis_connect_notebook_finds_the_experiment_its_start_notebook_started_on_a_port(tmp_path, prefect_server):
    """NNI's ``python_api_start`` and ``python_api_connect`` notebooks, in two processes: one kernel holds
    ``start(8080)``'s experiment, the other ``connect(8080)``s to it (nothing listens on 8080: the Prefect
    server is elsewhere) while it runs and raises its budget, and again after its end, as NNI's manager
    keeps its port until it is stopped: a budget raised then runs more trials, as NNI's does; ``stop()``
    gives the port up. A port no experiment is on is one line naming the ports in use."""
    hold = tmp_path / "hold"
    hold.touch()
    (tmp_path / "start.py").write_text(_quickstart(tmp_path, """\
        import sys
        experiment.start(8080)
        print("STARTED", experiment.id, flush=True)
        sys.stdin.read()  # the kernel stays until its notebook is closed
        """, hold=hold))
    kernel = subprocess.Popen([sys.executable, "start.py"], cwd=tmp_path, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    connect = textwrap.dedent("""\
        from nni.experiment import Experiment
        from trialflow.experiments import ExperimentNotFound
        def connect(port):
            try:
                return Experiment.connect(port)
            except ExperimentNotFound as error:
                print("NOT FOUND", error)
        """)
    try:
        line = kernel.stdout.readline()
        while line and not line.startswith("STARTED "):
            line = kernel.stdout.readline()
        assert line, kernel.stderr.read()[-3000:]
        exp_id = line.split()[1]
        api_port = int(prefect_server.split(":")[2].split("/")[0])
        running = _python(tmp_path, connect + textwrap.dedent("""\
            connect(8081)
            experiment = connect(8080)
            print("CONNECTED", experiment.id, experiment.get_status())
            print("BUDGET", experiment.get_experiment_profile()["params"]["maxTrialNumber"])
            experiment.update_max_trial_number(5)
            print("BUDGET", experiment.get_experiment_profile()["params"]["maxTrialNumber"])
            """))
        assert running.returncode == 0, running.stdout[-3000:] + running.stderr[-3000:]
        lines = running.stdout.splitlines()
        assert [x.split()[:2] for x in lines if x.startswith("CONNECTED ")] == [["CONNECTED", exp_id]]
        assert [x for x in lines if "BUDGET" in x] == ["BUDGET 4", "BUDGET 5"]
        in_use = ", ".join(map(str, sorted({8080, api_port})))
        assert (f"NOT FOUND no experiment is on port 8081 (ports in use: {in_use}): `trialflow experiment list` "
                "shows the running ones") in lines
        store = open_store(tmp_path / "w", exp_id)
        hold.unlink()
        wait_for(lambda: store.experiment().status == "DONE", timeout=120)
        ended = _python(tmp_path, connect + textwrap.dedent("""\
            import time
            experiment = connect(8080)
            print("CONNECTED", experiment.id, experiment.get_status(), len(experiment.export_data()))
            experiment.update_max_trial_number(7)  # NNI's manager, up after DONE, runs on
            while experiment.get_status() != "DONE" or len(experiment.export_data()) < 7:
                time.sleep(0.1)
            print("DONE", len(experiment.export_data()))
            experiment.stop()
            connect(8080)
            """))
        assert ended.returncode == 0, ended.stdout[-3000:] + ended.stderr[-3000:]
        lines = ended.stdout.splitlines()
        assert lines[0] == f"CONNECTED {exp_id} DONE 5"  # held by the kernel that started it: still on its port
        assert f"maxTrialNumber of {exp_id} set to 7 (5 run before)" in lines
        assert any(x.startswith(f"experiment {exp_id} started in the background") for x in lines)
        assert lines[-2:] == ["DONE 7", "NOT FOUND no experiment is on port 8080: `trialflow experiment list` shows "
                                        "the running ones"]
    finally:
        kernel.communicate(timeout=60)  # its notebook closed
    assert kernel.returncode == 0
    assert store.experiment().status == "DONE" and len(store.trials(["SUCCEEDED"])) == 7


def test_bad_nni_experiment_input_is_one_line_naming_the_fix(tmp_path):
    """A missing required field and an id trialflow cannot use: one line each, nothing made."""
    missing = _python(tmp_path, _quickstart(tmp_path, "experiment.config.trial_concurrency = None\nexperiment.run()\n"))
    assert missing.returncode == 1 and "trialConcurrency" in missing.stderr.splitlines()[-1], missing.stderr[-2000:]
    bad_id = _python(tmp_path, _quickstart(tmp_path, "experiment = Experiment(experiment.config, id='../My_Exp')\n"))
    assert bad_id.stderr.splitlines()[-1].endswith(
        "experiment id '../My_Exp' is not one trialflow makes: its ids are 8 lowercase letters and digits (leave id "
        "out to have one made)"), bad_id.stderr[-2000:]
    assert not (tmp_path / "w").exists() or list((tmp_path / "w").iterdir()) == []


def test_a_port_names_its_running_experiment_before_ended_ones_their_starters_still_hold(tmp_path):
    """``connect(port)``'s and ``stop --port``'s choice: a running experiment first; after their end, only
    experiments whose starting process lives (the same pid started at the same time) and has not given
    the port up; several alike are named, never guessed."""
    import os
    import time

    from trialflow.app.control import release_web_port
    from trialflow.experiments import ExperimentNotFound, create_experiment, the_one_on_port
    from trialflow.records.store import ExperimentStore
    from trialflow.records.store_records import Control
    from trialflow.trial.procs import process_start_time

    here = {"port": 8080, "pid": os.getpid(), "start_time": process_start_time(os.getpid())}
    gone = {**here, "start_time": -1}  # this pid, but another process: the one that held it has ended
    config = parse_config({"trialCommand": "true", "trialConcurrency": 1, "searchSpace": {
        "x": {"_type": "choice", "_value": [1]}}, "tuner": {"name": "Random"}, "trainingService": {"platform": "local"},
        "experimentWorkingDirectory": str(tmp_path / "w")})

    def experiment(held: dict, status: str) -> tuple[str, ExperimentStore]:
        exp_id, exp_dir = create_experiment(config)
        store = ExperimentStore.embedded(exp_dir, exp_id)
        store.set_control(Control.WEB_PORT, held)
        if status != "INITIALIZED":
            store.set_experiment(status=status, end_time=time.time())
        return exp_id, store

    running, running_store = experiment(gone, "INITIALIZED")  # a live one keeps its port whoever started it
    held, held_store = experiment(here, "DONE")
    experiment(gone, "DONE")  # its starter is gone: on no port
    root = tmp_path / "w"
    assert the_one_on_port(8080, root).id == running
    running_store.set_experiment(status="STOPPED", end_time=time.time())
    assert the_one_on_port(8080, root).id == held
    other, _ = experiment(here, "DONE")
    with pytest.raises(ExperimentNotFound) as both:
        the_one_on_port(8080, root)
    named = str(both.value).removeprefix("2 experiments are on port 8080 (").removesuffix("): give the id of one")
    assert sorted(named.split(", ")) == sorted([held, other])
    release_web_port(held_store)  # its stop(): the port is given up
    assert the_one_on_port(8080, root).id == other
    # `create --port 8081` while the server runs on 8080: both run there, 8080 is the first one's own
    on_server, on_server_store = experiment({**here, "port": 8080}, "INITIALIZED")
    second, second_store = experiment({**here, "port": 8081}, "INITIALIZED")
    for store in (on_server_store, second_store):
        store.set_experiment(prefect_api="http://127.0.0.1:8080/api")
    assert (the_one_on_port(8080, root).id, the_one_on_port(8081, root).id) == (on_server, second)
    for store in (on_server_store, second_store):
        store.set_experiment(status="STOPPED", end_time=time.time())


def test_every_platforms_config_object_nni_gives_makes_the_section_its_yaml_would(tmp_path):
    """``nni.experiment.config``'s objects for the job platforms (``KubeflowConfig`` with its roles and
    Kubernetes storage, ``FrameworkControllerConfig``, ``OpenpaiConfig``, ``AmlConfig``, ``DlcConfig``) and
    shared storage (``NfsConfig``), imported where NNI's code imports them: the mapping each gives is the
    section of the README's example configs, and an experiment config made from them loads."""
    from nni.experiment.config import (
        AlgorithmConfig,
        AmlConfig,
        DlcConfig,
        FrameworkAttemptCompletionPolicy,
        FrameworkControllerConfig,
        FrameworkControllerRoleConfig,
        K8sNfsConfig,
        KubeflowConfig,
        KubeflowRoleConfig,
        NfsConfig,
        OpenpaiConfig,
    )

    from tests.test_config import _examples

    examples = _examples(tmp_path)
    nfs = K8sNfsConfig(server="10.0.0.1", path="/exports/nni")
    kubeflow = KubeflowConfig(operator="tf-operator", api_version="v1", storage=nfs, worker=KubeflowRoleConfig(
        replicas=2, command="python3 trial.py", gpu_number=0, cpu_number=1, memory_size="2gb",
        docker_image="msranni/nni"))
    kubeflow.ps = KubeflowRoleConfig(replicas=1, command="python3 ps.py", cpu_number=1, memory_size=1024)
    framework = FrameworkControllerConfig(storage=nfs, service_account_name="frameworkbarrier")
    framework.task_roles.append(FrameworkControllerRoleConfig(
        name="worker", task_number=1, command="python3 t.py", gpu_number=0, cpu_number=1, memory_size="4gb",
        framework_attempt_completion_policy=FrameworkAttemptCompletionPolicy(min_failed_task_count=1,
                                                                              min_succeed_task_count=1)))
    made = {
        "kubeflow": kubeflow, "frameworkcontroller": framework,
        "openpai": OpenpaiConfig(host="pai.example.com", username="u", token="t", trial_cpu_number=2,
                                 trial_memory_size="8GB", storage_config_name="confignfs",
                                 local_storage_mount_point=tmp_path / "mnt",
                                 container_storage_mount_point="/mnt/confignfs", virtual_cluster="default"),
        "aml": AmlConfig(subscription_id="sub", resource_group="rg", workspace_name="ws", compute_target="gpu-cluster"),
        "dlc": DlcConfig(type="Worker", image="registry/pai-dlc/tf:1.15", job_type="TFJob", pod_count=1,
                         ecs_spec="ecs.c6.large", region="cn-hangzhou", workspace_id="None",
                         nas_data_source_id="ds1", access_key_id="id", access_key_secret="dlc-s3cr3t-value",
                         local_storage_mount_point="/home/admin/workspace/",
                         container_storage_mount_point="/root/data/"),
    }
    for platform, section in made.items():
        assert section.json() == examples[platform], platform
        assert "dlc-s3cr3t-value" not in repr(section) and "token='t'" not in repr(section)
        config = ExperimentConfig(platform, search_space={"x": {"_type": "uniform", "_value": [0, 1]}},
                                  trial_command="python3 trial.py", trial_concurrency=1,
                                  tuner=AlgorithmConfig(name="Random"))
        config.trial_gpu_number = 0 if platform == "openpai" else None  # as the README's example has it
        assert type(config.training_service) is type(section)  # Experiment('kubeflow') gives NNI's class
        config.training_service = section
        assert parse_config(config.json()).services[0].platform == platform
    shared = NfsConfig(local_mount_point=str(tmp_path / "mnt"), remote_mount_point="/tmp/nni",
                       local_mounted="usermount", nfs_server="10.0.0.1", exported_directory="/exports")
    assert shared.json() == {"storageType": "NFS", "localMountPoint": str(tmp_path / "mnt"),
                             "remoteMountPoint": "/tmp/nni", "localMounted": "usermount", "nfsServer": "10.0.0.1",
                             "exportedDirectory": "/exports"}


@pytest.mark.usefixtures("prefect_server")
def test_run_or_resume_has_checkpoint_load_checkpoint_and_nni_2s_view_of_an_id(tmp_path):
    """NNI 3's ``run_or_resume`` runs a new experiment and resumes a known one (``has_checkpoint``), as
    NNI's own ``test_experiment_resume_with_id`` does; ``load_checkpoint`` gives an object made from an id
    the experiment's config; NNI 2's ``Experiment.view(id)`` and ``Experiment.resume(id)`` still work; an
    object viewing an ended experiment (``view(non_blocking=True)``) says VIEWED until its ``stop()``."""
    hold = tmp_path / "hold"
    hold.touch()
    out = _python(tmp_path, _quickstart(tmp_path, f"""\
        import os, time
        print("HAS", experiment.has_checkpoint())
        experiment.run_or_resume(8080, wait_completion=False)  # none yet: run
        while [j.status for j in experiment.list_trial_jobs()] != ["RUNNING"] * 2:
            time.sleep(0.1)
        experiment.stop()
        again = Experiment(None, id=experiment.id)
        print("HAS", again.has_checkpoint())
        again.load_checkpoint()
        print("CONFIG", again.config["maxTrialNumber"], again.config["trialConcurrency"])
        os.remove({str(hold)!r})
        print("RESUMED", again.run_or_resume())  # known: resumed, here, to its end
        print("STATUS", again.get_status(), len(again.export_data()))
        Experiment.view(again.id)
        viewer = Experiment(None, id=again.id).view(non_blocking=True)  # NNI's test_experiment's view
        print("STATUS", viewer.get_status(), again.get_status())
        viewer.stop()
        print("STATUS", viewer.get_status())
        print("RESUMED", Experiment.resume(again.id))  # nothing left to run
        """, hold=hold))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert [x for x in lines if x.startswith(("HAS", "CONFIG", "RESUMED", "STATUS"))] == [
        "HAS False", "HAS True", "CONFIG 4 2", "RESUMED True", "STATUS DONE 2", "STATUS VIEWED DONE", "STATUS DONE",
        "RESUMED True"]
    exp_id = next(x for x in lines if x.startswith("experiment id: ")).split()[2]
    assert any(x.startswith(f"experiment {exp_id} DONE; Prefect UI: http") for x in lines)
    store = open_store(tmp_path / "w", exp_id)
    assert sorted(t.status for t in store.trials()) == ["SUCCEEDED", "SUCCEEDED", "USER_CANCELED", "USER_CANCELED"]
