"""nnictl's commands and flags, spelled as NNI spells them, on a real experiment: the ones a script or
an NNI user's fingers reach for (README's CLI table maps each one)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from tests.conftest import base_config, wait_for, write_trial
from trialflow.console_script import chooses_the_server
from trialflow.experiments import list_experiments, open_store
from trialflow.server.kept_server import ServerError, ui_path_prefix

HELD = ("import os, time, nni\np = nni.get_next_parameter()\nwhile os.path.exists({hold!r}):\n    time.sleep(0.2)\n"
        "nni.report_intermediate_result(p['x'])\nnni.report_final_result(p['x'])\n")


def nnictl(*args: str, env: dict, timeout: float = 120, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trialflow.cli", *args], capture_output=True, text=True,
                          env={**env, "COLUMNS": "200"}, timeout=timeout, cwd=cwd)


def ok(*args: str, env: dict) -> str:
    proc = nnictl(*args, env=env)
    assert proc.returncode == 0, f"{args}: {proc.stdout}{proc.stderr}"
    return proc.stdout


def test_nnictl_commands_on_a_running_then_stopped_experiment(tmp_path, prefect_server):
    hold = tmp_path / "hold"
    hold.touch()
    write_trial(tmp_path / "code", HELD.format(hold=str(hold)))
    config = tmp_path / "config.yml"
    config.write_text(yaml.safe_dump(base_config(tmp_path / "code", tmp_path / "w", trialConcurrency=1,
                                                 maxTrialNumber=3, searchSpace={"x": {"_type": "choice",
                                                                                      "_value": [1]}})))
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "TRIALFLOW_HOME": str(tmp_path / "w")}
    ok("create", "--config", str(config), env=env)
    exp_id = wait_for(lambda: next((e.id for e in list_experiments(tmp_path / "w")), None), timeout=60)
    store = open_store(tmp_path / "w", exp_id)
    first = wait_for(lambda: store.trials(["RUNNING"]), timeout=90)[0]

    # the experiment id left out: nnictl's "the only running experiment"
    assert exp_id in ok("experiment", "list", env=env)
    assert json.loads(ok("experiment", "status", env=env)) == {"errors": [], "status": "RUNNING"}
    assert yaml.safe_load(ok("config", "show", env=env))["maxTrialNumber"] == 3
    assert first.id in ok("trial", "ls", env=env)
    (tmp_path / "new_space.json").write_text('{"x": {"_type": "choice", "_value": [7]}}')
    ok("update", "searchspace", "-f", str(tmp_path / "new_space.json"), env=env)
    wait_for(lambda: store.experiment().config["searchSpace"]["x"]["_value"] == [7], timeout=30)  # applied
    ok("update", "concurrency", "--value", "2", env=env)
    ok("update", "trialnum", "-v", "4", env=env)
    ok("update", "duration", "-v", "1h", env=env)
    assert store.experiment().controls["trial_concurrency"] == 2
    assert store.experiment().controls["max_trial_number"] == 4
    assert store.experiment().controls["max_experiment_duration"] == 3600
    assert "log/experiment.log" in ok("log", "stdout", "--path", env=env)
    assert "running on local" in ok("log", "stdout", "-H", "5", env=env)
    assert ok("log", "stderr", "--path", env=env).strip() == str(tmp_path / "w" / exp_id / "log" / "controller.out")
    assert nnictl("log", "stderr", "-T", "5", env=env).returncode == 0
    url = ok("webui", "url", env=env)
    assert f"/runs/flow-run/{store.experiment().flow_run_id}" in url
    ok("trial", "kill", "-T", first.id, env=env)
    wait_for(lambda: store.trial(first.id).status == "USER_CANCELED", timeout=30)
    ok("log", "trial", "--trial_id", first.id, env=env)

    top = subprocess.Popen([sys.executable, "-m", "trialflow.cli", "top", "--time", "1"], stdout=subprocess.PIPE,
                           text=True, env={**env, "COLUMNS": "200"})
    try:
        assert "Ctrl-C quits" in top.stdout.readline()  # it is watching
        time.sleep(2)
        top.send_signal(signal.SIGINT)
        out = top.communicate(timeout=60)[0]
    finally:
        if top.poll() is None:  # it did not quit: it must not outlive the test
            top.kill()
            top.wait()
    assert top.returncode == 0 and exp_id in out
    live = [t.id for t in store.trials() if t.status in ("RUNNING", "WAITING")]  # its trials, as its help says
    assert "their live trials" in out and live and any(trial_id in out for trial_id in live)

    hold.unlink()  # trials finish from here on; the later ones come from the new search space
    wait_for(lambda: store.experiment().status == "DONE", timeout=120)
    later = [t for t in store.trials() if t.sequence > first.sequence]
    assert later and {t.parameters["x"] for t in later} == {7}
    running_only = nnictl("experiment", "status", env=env)
    assert running_only.returncode == 1 and "no experiment is running" in running_only.stdout
    listing = ok("experiment", "list", env=env)
    assert exp_id not in listing and "no experiment is running" in listing and "--all" in listing
    assert exp_id in ok("experiment", "list", "--all", env=env)
    # nnictl's habit with a DONE experiment: a larger trial budget runs it on, as NNI's manager does
    raised = ok("update", "trialnum", exp_id, "-v", "5", env=env)
    assert f"maxTrialNumber of {exp_id} set to 5 (4 run before)" in raised and "started in the background" in raised
    wait_for(lambda: store.count_trials() == 5 and store.experiment().status == "DONE", timeout=120)
    assert max(store.trials(), key=lambda t: t.sequence).status == "SUCCEEDED"
    spent = ok("update", "duration", exp_id, "-v", "2h", env=env)  # the trial budget is spent: only set
    assert "takes effect when the experiment runs again" in spent and store.experiment().status == "DONE"

    # save, and load as another machine would (its own TRIALFLOW_HOME), code included; here, where the
    # experiment is known, a second copy is refused
    ok("experiment", "save", exp_id, "--path", str(tmp_path / "pkg"), "--saveCodeDir", env=env)
    package = tmp_path / "pkg" / f"trialflow_experiment_{exp_id}.tar.gz"
    twice = nnictl("experiment", "load", "-p", str(package), "-c", str(tmp_path / "code2"), "-l", str(tmp_path / "w2"),
                   env=env)
    assert twice.returncode == 1 and f"experiment {exp_id} is already in" in twice.stdout
    assert len(twice.stdout.strip().splitlines()) == 1 and not (tmp_path / "w2").exists()
    env = {**env, "TRIALFLOW_HOME": str(tmp_path / "other-machine")}
    ok("experiment", "load", "-p", str(package), "-c", str(tmp_path / "code2"), "-l", str(tmp_path / "w2"), env=env)
    assert (tmp_path / "code2" / "trial.py").is_file()
    loaded = open_store(tmp_path / "w2", exp_id)
    assert [t.status for t in loaded.trials()] == [t.status for t in store.trials()]
    assert all(t.log_dir.startswith(str(tmp_path / "w2")) for t in loaded.trials())
    assert loaded.experiment().config["trialCodeDirectory"] == str(tmp_path / "code2")
    assert "trial.stdout" in ok("log", "trial", exp_id, "-T", first.id, "--root", str(tmp_path / "w2"), env=env)
    ok("experiment", "delete", "--all", "--yes", "--root", str(tmp_path / "w2"), env=env)
    assert not (tmp_path / "w2" / exp_id).exists() and (tmp_path / "w" / exp_id).exists()


def test_stop_without_an_id_stops_the_only_running_experiment(tmp_path, prefect_server):
    hold = tmp_path / "hold"
    hold.touch()
    write_trial(tmp_path / "code", HELD.format(hold=str(hold)))
    config = tmp_path / "config.yml"
    config.write_text(yaml.safe_dump(base_config(tmp_path / "code", tmp_path / "w", maxTrialNumber=1)))
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "TRIALFLOW_HOME": str(tmp_path / "w")}
    ok("create", "--config", str(config), env=env)
    exp_id = wait_for(lambda: next((e.id for e in list_experiments(tmp_path / "w")), None), timeout=60)
    store = open_store(tmp_path / "w", exp_id)
    wait_for(lambda: store.trials(["RUNNING"]), timeout=90)
    ok("stop", env=env)
    assert store.experiment().status == "STOPPED"
    assert "no experiment is running" in nnictl("stop", env=env).stdout


def test_version_algo_package_and_ss_gen(tmp_path):
    env = {**os.environ, "TRIALFLOW_CONFIG_DIR": str(tmp_path / "config")}
    from trialflow import __version__

    assert ok("--version", env=env).strip() == __version__ == ok("-v", env=env).strip()
    algo = tmp_path / "algo"
    algo.mkdir()
    (algo / "my_tuner.py").write_text("from nni.tuner import Tuner\nclass MyTuner(Tuner):\n"
                                      "    def generate_parameters(self, *a, **k): return {}\n"
                                      "    def receive_trial_result(self, *a, **k): pass\n"
                                      "    def update_search_space(self, *a, **k): pass\n")
    meta = algo / "meta.yml"
    meta.write_text(yaml.safe_dump({"algoType": "tuner", "builtinName": "MyTuner", "className": "my_tuner.MyTuner"}))
    ok("algo", "reg", "--meta_path", str(meta), env=env)
    shown = yaml.safe_load(ok("algo", "show", "MyTuner", env=env))
    assert shown["className"] == "my_tuner.MyTuner" and shown["algoType"] == "tuner"
    assert yaml.safe_load(ok("algo", "show", "GP", env=env))["extra"] == "trialflow[gp]"
    ok("algo", "unreg", "MyTuner", env=env)
    assert "gp: needs scikit-learn (pip install 'trialflow[gp]')" in ok("package", "show", env=env)
    listed = ok("algo", "list", env={**env, "COLUMNS": "160"})  # NNI's names, one row per algorithm
    rows = [line.split("│")[1:5] for line in listed.splitlines() if line.startswith("│")]
    names = [r[0].strip() for r in rows if len(r) == 4 and r[2].strip() in ("tuner", "assessor")]
    assert {"TPE", "GPTuner", "MetisTuner", "PBTTuner", "BatchTuner", "Medianstop", "Curvefitting"} <= set(names)
    assert "gptuner" not in names and names.count("GPTuner") == 1
    from trialflow.assessors import ASSESSORS
    from trialflow.assessors import NNI_NAMES as ASSESSOR_NAMES
    from trialflow.tuners import NNI_NAMES, TUNERS

    assert set(NNI_NAMES) == set(TUNERS) and set(ASSESSOR_NAMES) == set(ASSESSORS)  # each one named
    unknown = nnictl("algo", "show", "Nope", env=env)  # names every built-in one, as the tables do
    assert unknown.returncode == 1 and unknown.stdout.count("\n") == 1 and unknown.stdout.startswith("error:")
    assert all(name in unknown.stdout for name in {*NNI_NAMES.values(), *ASSESSOR_NAMES.values()}), unknown.stdout
    assert "TPE needs no extra package" in ok("package", "install", "TPE", env=env)
    installed = ok("package", "install", "GP", env=env)  # already there: two lines, not pip's log
    assert installed.splitlines() == ["pip install 'trialflow[gp]' ...", "GP: scikit-learn installed"]
    ppo = nnictl("package", "install", "PPOTuner", env=env)
    assert ppo.returncode == 1 and "neural architecture search tuners, out of trialflow's scope" in ppo.stdout
    assert "bohb: needs statsmodels (pip install 'trialflow[bohb]')" in ok("package", "show", env=env)
    gen = nnictl("ss_gen", "-t", "python3 trial.py", env=env)
    assert gen.returncode == 1 and "annotations, which NNI 3.0 removed" in gen.stdout
    for action in ("install", "uninstall"):  # NNI's JupyterLab tab: one line saying where the UI is instead
        jupyter = nnictl("jupyter-extension", action, env=env)
        assert jupyter.returncode == 1 and jupyter.stdout.count("\n") == 1 and "trialflow webui url" in jupyter.stdout


def test_nnictl_hello_writes_an_experiment_that_runs_as_written_and_never_writes_over_a_path(tmp_path,
                                                                                          prefect_server):
    """NNI's first command: ``hello`` writes nni_hello_hpo/, whose main.py (NNI's Python API) runs ten
    trials that each report five epochs; a second hello, or a link already named so, is refused and
    nothing is written over or through it."""
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "TRIALFLOW_HOME": str(tmp_path / "w")}
    here = tmp_path / "here"
    here.mkdir()
    made = nnictl("hello", env=env, cwd=here)
    assert made.returncode == 0 and 'Please run "python3 nni_hello_hpo/main.py"' in made.stdout, made.stdout
    assert sorted(p.name for p in (here / "nni_hello_hpo").iterdir()) == ["main.py", "model.py"]
    ran = subprocess.run([sys.executable, "nni_hello_hpo/main.py"], cwd=here, env=env, capture_output=True,
                         text=True, timeout=240)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    (record,) = list_experiments(tmp_path / "w")
    store = open_store(tmp_path / "w", record.id)
    try:
        assert store.experiment().status == "DONE"
        trials = store.trials()
        assert len(trials) == 10 and {t.status for t in trials} == {"SUCCEEDED"}
        finals = {m.trial_id: m.value for m in store.metrics() if m.type == "FINAL"}
        epochs = [m.trial_id for m in store.metrics() if m.type == "PERIODICAL"]
        assert all(epochs.count(t.id) == 5 and 0 < finals[t.id] <= 1 for t in trials)
        best = ran.stdout.split("best accuracy ")[1].split()  # "0.870", "from", "trial", "<id>:"
        assert best[0] == f"{max(finals.values()):.3f}" == f"{finals[best[3].rstrip(':')]:.3f}", ran.stdout
        assert min(finals.values()) < max(finals.values())  # its hyperparameters matter
    finally:
        store.close()
    printed = nnictl("log", "stderr", record.id, env=env)  # no background controller: it ran in main.py
    assert printed.returncode == 0 and "has run in the foreground only" in printed.stdout, printed.stdout

    main = (here / "nni_hello_hpo" / "main.py").read_bytes()
    again = nnictl("hello", env=env, cwd=here)
    assert again.returncode == 1 and again.stdout.count("\n") == 1 and "nni_hello_hpo already exists" in again.stdout
    assert (here / "nni_hello_hpo" / "main.py").read_bytes() == main
    shared = tmp_path / "shared"  # a folder others write to, where someone left a link named so
    shared.mkdir()
    (shared / "nni_hello_hpo").symlink_to(tmp_path / "theirs")
    linked = nnictl("hello", env=env, cwd=shared)
    assert linked.returncode == 1 and "nni_hello_hpo already exists" in linked.stdout
    assert not (tmp_path / "theirs").exists()


def test_an_update_made_through_trialflow_is_no_edit_of_the_config_file(tmp_path, prefect_server):
    """After `update searchspace` the file still names the old space: resumes and `log trial` say
    nothing of a changed config file, and the new space stays in force; a real edit is still warned."""
    write_trial(tmp_path / "code", "import nni\np = nni.get_next_parameter()\nnni.report_final_result(p['x'])\n")
    (tmp_path / "space.json").write_text('{"x": {"_type": "choice", "_value": [1]}}')
    config = base_config(tmp_path / "code", tmp_path / "w", maxTrialNumber=1, trialConcurrency=1,
                         searchSpaceFile=str(tmp_path / "space.json"))
    del config["searchSpace"]
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "TRIALFLOW_HOME": str(tmp_path / "w")}
    created = nnictl("create", "--config", str(path), "--foreground", env=env)
    assert created.returncode == 0, created.stdout + created.stderr
    (exp_id,) = [e.id for e in list_experiments(tmp_path / "w")]
    (tmp_path / "new_space.json").write_text('{"x": {"_type": "choice", "_value": [7]}}')
    ok("update", "searchspace", exp_id, "-f", str(tmp_path / "new_space.json"), env=env)
    outputs = []
    for budget in ("2", "3"):  # (`update trialnum` would run the DONE experiment on in the background)
        resumed = nnictl("resume", exp_id, "--trialnum", budget, "--foreground", env=env)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        outputs.append(resumed.stdout + resumed.stderr)
    store = open_store(tmp_path / "w", exp_id)
    trials = store.trials()
    outputs.append(nnictl("log", "trial", exp_id, "-T", trials[-1].id, env=env).stdout)
    outputs.append((tmp_path / "w" / exp_id / "log" / "experiment.log").read_text())
    assert not [o for o in outputs if "changed since it was created" in o]
    assert [t.parameters["x"] for t in trials] == [1, 7, 7]
    config["maxTrialDuration"] = "1h"  # an edit of the file: said once, when the experiment runs
    path.write_text(yaml.safe_dump(config))
    edited = nnictl("resume", exp_id, "--trialnum", "4", "--foreground", env=env)
    assert "changed since it was created (maxTrialDuration)" in edited.stdout + edited.stderr
    assert store.trials()[-1].parameters["x"] == 7


@pytest.mark.parametrize("args", [["--port", "4300"], ["--port=4300"], ["-p", "4300"], ["-p4300"],
                                  ["--url_prefix", "nni"], ["--url_prefix=nni"], ["--url-prefix", "nni"], ["-u", "nni"],
                                  ["-unni"]])
def test_a_create_choosing_the_servers_port_or_ui_path_starts_the_server_itself(args):
    """The console script starts the server early only when the command leaves its port and path alone:
    an early start with the last ones would make a create with others fail."""
    assert chooses_the_server(["create", "--config", "c.yml", *args])
    assert not chooses_the_server(["create", "--config", "c.yml", "-f", "--dashboard-port", "8081"])


@pytest.mark.parametrize(("given", "path"), [("nni", "/nni"), ("/team/nni/", "/team/nni"), ("//a//b", "/a/b"),
                                             ("/", ""), ("", ""), ("v1.2_x~y-z", "/v1.2_x~y-z")])
def test_url_prefix_is_read_as_nnictl_writes_it(given, path):
    assert ui_path_prefix(given) == path


@pytest.mark.parametrize("given", ["a b", "../x", "a/./b", "api", "/api/v2", "ä", "x?y=1", "x#y"])
def test_a_url_prefix_that_is_no_plain_path_or_hides_the_api_is_refused(given):
    with pytest.raises(ServerError, match=r"^--url_prefix .*e\.g\. --url_prefix nni$"):
        ui_path_prefix(given)


@pytest.mark.parametrize("api", ["temporary", "profile"])
def test_a_port_or_ui_path_for_a_server_trialflow_does_not_use_is_one_line_and_creates_nothing(tmp_path, api):
    """`--port`/`--url_prefix` name trialflow's kept server: where experiments report elsewhere (Prefect's
    temporary server, an API the active profile sets) they would be ignored, so they are refused."""
    home = tmp_path / "prefect-home"
    home.mkdir()
    (home / "profiles.toml").write_text('active = "team"\n[profiles.team]\nPREFECT_API_URL = "http://127.0.0.1:9/api"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(TRIALFLOW_HOME=str(tmp_path / "tf"), PREFECT_HOME=str(home),
               TRIALFLOW_PREFECT_SERVER="temporary" if api == "temporary" else "kept")
    for flag in (["-p", "4390"], ["--url_prefix", "nni"]):
        proc = nnictl("create", "--config", "examples/quickstart/config.yml", *flag, env=env)
        why = ("TRIALFLOW_PREFECT_SERVER=temporary asks for Prefect's temporary server, which has no UI"
               if api == "temporary" else "your Prefect profiles set PREFECT_API_URL (`prefect config view` shows "
               "the active one)")
        name = "--port" if flag[0] == "-p" else "--url_prefix"
        assert proc.returncode == 1 and proc.stdout.strip() == (
            f"error: {name} is for trialflow's local Prefect server, but {why}: leave {name} out"), proc.stdout
    assert not (tmp_path / "tf").exists()
