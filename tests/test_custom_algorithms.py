"""Customized tuners and assessors written against NNI's API (nni.tuner.Tuner, nni.assessor.Assessor),
loaded by className + codeDirectory (v2), codeDir + classFileName + className (v1), or a name
registered with `trialflow algo register --meta`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import base_config, run_in_thread, wait_for, write_trial
from trialflow import parse_config, resume_experiment, run_experiment
from trialflow.config import AlgorithmConfig, ConfigError
from trialflow.experiments import open_store
from trialflow.trial import NNI_SHIM_DIR
from trialflow.tuners import TunerError, create_tuner

ALGORITHMS = Path(__file__).parent / "algorithms"
# The space is in the customized tuner's own format: trialflow's built-in validation would refuse it.
SPACE = {"x": {"_type": "cycle", "_value": [1, 5, 2, 6]}}
TRIAL = """
import time, nni
p = nni.get_next_parameter()
nni.report_intermediate_result(p["x"])
time.sleep(8 if p["x"] > 4 else 0.2)  # long enough for the assessor's verdict to land
nni.report_intermediate_result(p["x"] + 0.5)
nni.report_final_result({"default": p["x"] * 10, "x": p["x"]})
"""


@pytest.fixture
def algo_dir(tmp_path):
    """The user's algorithms in a folder of their own."""
    folder = tmp_path / "my_algorithms"
    folder.mkdir()
    shutil.copy(ALGORITHMS / "demo_tuner.py", folder)
    return folder


@pytest.fixture
def calls_log(tmp_path):
    return tmp_path / "calls.jsonl"


def _calls(path: Path, name: str) -> list[dict]:
    entries = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [e for e in entries if e["call"] == name]


def _config(tmp_path: Path, tuner: dict, assessor: dict | None = None, **overrides) -> dict:
    write_trial(tmp_path / "code", TRIAL)
    config = base_config(tmp_path / "code", tmp_path / "w", **{"searchSpace": SPACE, "tuner": tuner,
                                                                "maxTrialNumber": 10, **overrides})
    if assessor is not None:
        config["assessor"] = assessor
    return config


def _check_run(result, calls_log: Path, trials: int) -> None:
    """The tuner got the space as written and every final result with its parameters; the
    assessor's Bad verdicts ended trials as EARLY_STOPPED."""
    assert result.status == "DONE"
    assert len(result.trials) == trials  # NoMoreTrialError ended suggestion before maxTrialNumber
    assert [c["space"] for c in _calls(calls_log, "update_search_space")] == [SPACE]
    received = {c["parameter_id"]: c for c in _calls(calls_log, "receive_trial_result")}
    ended = {c["parameter_id"]: c["success"] for c in _calls(calls_log, "trial_end")}
    for trial in result.trials:
        x = trial.parameters["x"]
        assert trial.parameters == {"x": SPACE["x"]["_value"][trial.parameter_id % 4], "id": trial.parameter_id}
        if x > 4:
            assert trial.status == "EARLY_STOPPED", (trial.id, trial.status, trial.message)
            assert trial.parameter_id not in received and ended[trial.parameter_id] is False
        else:
            assert trial.status == "SUCCEEDED", (trial.id, trial.status, trial.message)
            got = received[trial.parameter_id]
            assert got["parameters"] == trial.parameters
            assert got["value"] == {"default": x * 10, "x": x} == trial.final  # as reported, dict and all
            assert got["reward"] == x * 10 and ended[trial.parameter_id] is True
    assessed = _calls(calls_log, "assess_trial")
    assert assessed and all(c["history"] for c in assessed)
    assert {c["trial"] for c in _calls(calls_log, "assessor_trial_end")} == {t.id for t in result.trials}


@pytest.mark.usefixtures("prefect_server")
def test_nni_api_tuner_and_assessor_by_class_name_drive_an_experiment(tmp_path, algo_dir, calls_log):
    tuner = {"className": "demo_tuner.CyclingTuner", "codeDirectory": str(algo_dir),
             "classArgs": {"log_file": str(calls_log), "limit": 6}}
    assessor = {"className": "demo_tuner.ThresholdAssessor", "codeDirectory": str(algo_dir),
                "classArgs": {"above": 4, "log_file": str(calls_log)}}
    result = run_experiment(_config(tmp_path, tuner, assessor, trialConcurrency=3))
    _check_run(result, calls_log, trials=6)


def _algo(args: list[str], config_dir: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRIALFLOW_CONFIG_DIR": str(config_dir)}
    return subprocess.run([sys.executable, "-m", "trialflow.cli", "algo", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def _meta(folder: Path, name: str, **fields) -> Path:
    path = folder / f"{name}.yml"
    path.write_text(yaml.safe_dump({"builtinName": name, **fields}))
    return path


@pytest.mark.usefixtures("prefect_server")
def test_registered_algorithms_drive_an_experiment_by_name(tmp_path, algo_dir, calls_log, monkeypatch):
    config_dir = tmp_path / "config"
    monkeypatch.setenv("TRIALFLOW_CONFIG_DIR", str(config_dir))
    tuner_meta = _meta(algo_dir, "CyclingTuner", algoType="tuner", className="demo_tuner.CyclingTuner",
                       classArgsValidator="demo_tuner.CyclingValidator")
    assessor_meta = _meta(algo_dir, "Threshold", algoType="assessor", className="demo_tuner.ThresholdAssessor")
    for meta in (tuner_meta, assessor_meta):
        proc = _algo(["register", "--meta", str(meta)], config_dir)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    listing = _algo(["list"], config_dir)
    assert "CyclingTuner" in listing.stdout and "Threshold" in listing.stdout and "assessor" in listing.stdout

    config = _config(tmp_path, {"name": "cyclingtuner", "classArgs": {"log_file": str(calls_log), "limit": 4}},
                     {"name": "Threshold", "classArgs": {"above": 4, "log_file": str(calls_log)}})
    _check_run(run_experiment(config), calls_log, trials=4)

    again = _algo(["register", "--meta", str(tuner_meta)], config_dir)
    assert again.returncode == 1 and "already registered" in again.stdout
    gone = _algo(["unregister", "CyclingTuner"], config_dir)
    assert gone.returncode == 0, gone.stdout + gone.stderr
    with pytest.raises(ConfigError, match=r"tuner.name: unknown tuner 'cyclingtuner'.*algo register"):
        parse_config(config)


def test_registration_refuses_bad_meta_files(tmp_path, algo_dir):
    config_dir = tmp_path / "config"
    cases = [
        (_meta(algo_dir, "TPE", algoType="tuner", className="demo_tuner.CyclingTuner"), "name of a built-in"),
        (_meta(algo_dir, "NoClass", algoType="tuner"), "missing className"),
        (_meta(algo_dir, "Advisor", algoType="advisor", className="demo_tuner.CyclingTuner"),
         "algoType must be tuner or assessor"),
        (_meta(algo_dir, "Missing", algoType="tuner", className="demo_tuner.NoSuchTuner"),
         "cannot load 'demo_tuner.NoSuchTuner'"),
    ]
    for meta, message in cases:
        proc = _algo(["register", "--meta", str(meta)], config_dir)
        assert proc.returncode == 1 and message in proc.stdout, (meta.name, proc.stdout + proc.stderr)
    registered = _algo(["list"], config_dir).stdout.split("registered")[1]
    assert "TPE" not in registered and "Missing" not in registered and "│" not in registered  # none was registered


def test_class_args_validator_of_a_registered_tuner(tmp_path, algo_dir, calls_log, monkeypatch):
    monkeypatch.setenv("TRIALFLOW_CONFIG_DIR", str(tmp_path / "config"))
    meta = _meta(algo_dir, "Validated", algoType="tuner", className="demo_tuner.CyclingTuner",
                 classArgsValidator="demo_tuner.CyclingValidator")
    assert _algo(["register", "--meta", str(meta)], tmp_path / "config").returncode == 0

    def tuner(**args):
        return create_tuner(AlgorithmConfig(name="Validated", class_args=args), SPACE)

    with pytest.raises(TunerError, match="classArgs rejected by CyclingValidator: optimize_mode should be "
                                         "maximize or minimize, not 'sideways'"):
        tuner(log_file=str(calls_log), optimize_mode="sideways")
    with pytest.raises(TunerError, match="log_file is required"):
        tuner()
    with pytest.raises(TunerError, match=r"unknown classArgs \['colour'\]"):
        tuner(log_file=str(calls_log), colour="red")
    ok = tuner(log_file=str(calls_log), optimize_mode="minimize", limit=2)
    assert [ok.suggest().parameters for _ in range(2)] == [{"x": 1, "id": 0}, {"x": 5, "id": 1}]
    assert ok.suggest() is None  # NoMoreTrialError after `limit`


def test_a_resumed_nni_tuner_gets_finished_trials_through_import_data(algo_dir, calls_log):
    spec = AlgorithmConfig(class_name="demo_tuner.CyclingTuner", code_directory=algo_dir,
                           class_args={"log_file": str(calls_log)})
    tuner = create_tuner(spec, SPACE)
    tuner.replay(3, {"parameters": {"x": 6, "id": 3}}, 60.0)
    tuner.replay(4, {"parameters": {"x": 1, "id": 4}}, None)  # failed: nothing to import
    assert [c["data"] for c in _calls(calls_log, "import_data")] == [[{"parameter": {"x": 6, "id": 3}, "value": 60.0}]]
    assert tuner.suggest().parameter_id == 5  # ids go on after the replayed ones


def test_a_v1_custom_tuner_section_converts_to_class_name(tmp_path, algo_dir):
    write_trial(tmp_path / "code", TRIAL)
    (tmp_path / "space.json").write_text(json.dumps(SPACE))
    v1 = {"authorName": "nni", "trialConcurrency": 1, "maxTrialNum": 2, "trainingServicePlatform": "local",
          "searchSpacePath": str(tmp_path / "space.json"),
          "tuner": {"codeDir": str(algo_dir), "classFileName": "demo_tuner.py", "className": "CyclingTuner",
                    "classArgs": {"log_file": "x"}},
          "trial": {"command": "python3 trial.py", "codeDir": str(tmp_path / "code")}}
    with pytest.warns(UserWarning, match="legacy v1"):
        config = parse_config(v1)
    assert config.tuner.class_name == "demo_tuner.CyclingTuner" and config.tuner.code_directory == algo_dir
    assert config.custom_tuner and config.search_space == SPACE


@pytest.mark.parametrize("fail_on", ["receive_trial_result", "generate_parameters"])
def test_a_tuner_that_raises_ends_the_experiment_as_error_with_its_traceback(tmp_path, algo_dir, calls_log,
                                                                             prefect_server, fail_on):
    tuner = {"className": "demo_tuner.CyclingTuner", "codeDirectory": str(algo_dir),
             "classArgs": {"log_file": str(calls_log), "fail_on": fail_on}}
    config = _config(tmp_path, tuner, maxTrialNumber=6, trialConcurrency=1,
                     searchSpace={"x": {"_type": "cycle", "_value": [1, 2]}})
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "PREFECT_API_URL": prefect_server}
    proc = subprocess.run([sys.executable, "-m", "trialflow.cli", "create", "--config", str(path)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (exp_dir,) = [p for p in (tmp_path / "w").iterdir() if (p / "db").is_dir()]
    store = open_store(tmp_path / "w", exp_dir.name)
    wait_for(lambda: store.experiment().status not in ("INITIALIZED", "RUNNING"), timeout=120)
    exploded = "ZeroDivisionError: receive exploded" if fail_on == "receive_trial_result" else \
        "RuntimeError: generate exploded"
    experiment = store.experiment()
    assert experiment.status == "ERROR"
    called = "generate_multiple_parameters" if fail_on == "generate_parameters" else fail_on  # what trialflow calls
    assert f"customized CyclingTuner.{called} raised {exploded}" in experiment.message
    log = wait_for(lambda: (t := (exp_dir / "log" / "experiment.log").read_text()) and "Traceback" in t and t)
    assert f'in {fail_on}' in log and exploded in log  # the user's frame and error, for them to fix
    assert all(t.is_terminal for t in store.trials())  # nothing left running


@pytest.mark.parametrize("foreground", [False, True])
def test_classargs_refused_by_the_validator_stop_create_with_one_line(tmp_path, algo_dir, calls_log, foreground):
    """As ``nnictl create``: a registered tuner's classArgsValidator runs before anything starts."""
    config_dir = tmp_path / "config"
    meta = _meta(algo_dir, "CyclingTuner", algoType="tuner", className="demo_tuner.CyclingTuner",
                 classArgsValidator="demo_tuner.CyclingValidator")
    assert _algo(["register", "--meta", str(meta)], config_dir).returncode == 0
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(_config(tmp_path, {"name": "CyclingTuner", "classArgs": {"limit": 2}})))
    env = {**os.environ, "TRIALFLOW_CONFIG_DIR": str(config_dir), "COLUMNS": "200"}
    proc = subprocess.run([sys.executable, "-m", "trialflow.cli", "create", "--config", str(path),
                           *(["--foreground"] if foreground else [])], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 1
    out = proc.stdout + proc.stderr
    assert out.strip().splitlines() == ["error: tuner CyclingTuner: classArgs rejected by CyclingValidator: "
                                        "log_file is required"]
    assert not (tmp_path / "w").exists() or not any((tmp_path / "w").iterdir())  # no experiment left behind


@pytest.mark.parametrize(("section", "class_name", "source", "message"), [
    ("tuner", "half.HalfTuner", "from nni.tuner import Tuner\nclass HalfTuner(Tuner):\n"
              "    def update_search_space(self, space): pass\n"
              "    def generate_parameters(self, parameter_id, **kwargs): return {'x': 1}\n",
     "error: tuner half.HalfTuner: HalfTuner does not implement receive_trial_result; a customized tuner "
     "subclasses nni.tuner.Tuner and implements it"),
    ("tuner", "half.NotATuner", "class NotATuner:\n    pass\n",
     "error: tuner half.NotATuner: NotATuner does not implement generate_parameters or "
     "generate_multiple_parameters, receive_trial_result, update_search_space; a customized tuner subclasses "
     "nni.tuner.Tuner and implements them"),
    ("assessor", "half.HalfAssessor", "from nni.assessor import Assessor\nclass HalfAssessor(Assessor):\n"
                 "    def trial_end(self, trial_job_id, success): pass\n",
     "error: assessor half.HalfAssessor: HalfAssessor does not implement assess_trial; a customized assessor "
     "subclasses nni.assessor.Assessor and implements it"),
], ids=["tuner-without-receive_trial_result", "not-a-tuner", "assessor-without-assess_trial"])
def test_a_customized_algorithm_missing_an_nni_method_stops_create_with_one_line(tmp_path, section, class_name,
                                                                                 source, message):
    """NNI's base classes raise NotImplementedError at the first call of a method a customized class
    forgot, mid-experiment; trialflow names it at ``create``, before anything starts."""
    algo = tmp_path / "algo"
    algo.mkdir()
    (algo / "half.py").write_text(source)
    spec = {"className": class_name, "codeDirectory": str(algo)}
    config = _config(tmp_path, spec if section == "tuner" else {"name": "Random"},
                     spec if section == "assessor" else None, searchSpace={"x": {"_type": "choice", "_value": [1, 2]}})
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.run([sys.executable, "-m", "trialflow.cli", "create", "--config", str(path)],
                          capture_output=True, text=True, env={**os.environ, "COLUMNS": "300"}, timeout=120)
    assert proc.returncode == 1
    assert (proc.stdout + proc.stderr).strip().splitlines() == [message]
    assert not (tmp_path / "w").exists() or not any((tmp_path / "w").iterdir())  # no experiment left behind


@pytest.mark.usefixtures("prefect_server")
def test_an_nni_tuner_keeps_state_in_its_checkpoint_folder_and_loads_it_when_the_experiment_resumes(tmp_path):
    """As NNI's dispatcher: a customized tuner and assessor see NNI_CHECKPOINT_DIRECTORY (the experiment's
    checkpoint/ folder, kept across runs) and NNI_MODE; a resume calls load_checkpoint() on each before
    anything else; the trials inherit neither variable."""
    folder = tmp_path / "my_algorithms"
    folder.mkdir()
    shutil.copy(ALGORITHMS / "checkpoint_tuner.py", folder)
    log, seen = tmp_path / "calls.jsonl", tmp_path / "trial_env.jsonl"
    write_trial(tmp_path / "code", f"""
        import json, os, nni
        p = nni.get_next_parameter()
        with open({str(seen)!r}, "a") as f:
            f.write(json.dumps([os.environ.get("NNI_CHECKPOINT_DIRECTORY"), os.environ.get("NNI_MODE")]) + "\\n")
        nni.report_final_result(p["x"] * 10)
        """)
    config = base_config(tmp_path / "code", tmp_path / "w", maxTrialNumber=2, trialConcurrency=1,
                         tuner={"className": "checkpoint_tuner.SavingTuner", "codeDirectory": str(folder),
                                "classArgs": {"log_file": str(log)}},
                         assessor={"className": "checkpoint_tuner.LoadingAssessor", "codeDirectory": str(folder),
                                   "classArgs": {"log_file": str(log)}})
    first = run_experiment(config)
    assert first.status == "DONE" and [t.status for t in first.trials] == ["SUCCEEDED"] * 2
    checkpoint = tmp_path / "w" / first.experiment_id / "checkpoint"
    assert checkpoint.is_dir() and checkpoint.stat().st_mode & 0o777 == 0o700
    assert json.loads((checkpoint / "tuner.json").read_text()) == {"0": 10, "1": 20}
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(c["call"], c["mode"], c["path"]) for c in calls] == [("update_search_space", "start", str(checkpoint))]

    log.unlink()
    result = resume_experiment(first.experiment_id, tmp_path / "w", max_trial_number=3)
    assert result.status == "DONE" and len(result.trials) == 3
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    # each object's first call (NNI calls the tuner's and the assessor's before it hands anything over)
    assert [c["call"] for c in calls if c["call"] != "assessor_load_checkpoint"] == ["load_checkpoint",
                                                                                    "update_search_space"]
    assert [c["call"] for c in calls].count("assessor_load_checkpoint") == 1
    assert calls[0]["results"] == {"0": 10, "1": 20} and calls[0]["path"] == str(checkpoint)
    assert {(c["mode"], c["env_dir"]) for c in calls} == {("resume", str(checkpoint))}
    assert json.loads((checkpoint / "tuner.json").read_text()) == {"0": 10, "1": 20, "2": 30}
    assert [json.loads(line) for line in seen.read_text().splitlines()] == [[None, None]] * 3


def test_nnis_recoverable_helpers_remember_resumed_trials_parameters(tmp_path, monkeypatch):
    """The helpers NNI's Hyperband and BOHB advisors call on resumed trials' records, with NNI's rules: a
    record may be a JSON string, a customized trial's id is skipped, and a missing folder is no path."""
    monkeypatch.syspath_prepend(NNI_SHIM_DIR)
    from nni.recoverable import Recoverable

    tuner = Recoverable()
    assert not tuner.is_created_in_previous_exp(0) and not tuner.is_created_in_previous_exp(None)
    records = [{"parameter_id": 3, "parameter_source": "resumed", "parameters": {"x": 1}},
               json.dumps({"parameter_id": 7, "parameters": {"x": 2}}),
               {"parameter_id": "customized-1", "parameters": {"x": 9}}]
    assert tuner.recover_parameter_id(records) == 7
    assert tuner.is_created_in_previous_exp(7) and not tuner.is_created_in_previous_exp(8)
    assert tuner.get_previous_param(3) == {"x": 1} and tuner.get_previous_param(7) == {"x": 2}
    with pytest.raises(KeyError):
        tuner.get_previous_param(5)
    monkeypatch.setenv("NNI_CHECKPOINT_DIRECTORY", str(tmp_path / "gone"))
    assert tuner.get_checkpoint_path() is None
    monkeypatch.setenv("NNI_CHECKPOINT_DIRECTORY", str(tmp_path))
    assert tuner.get_checkpoint_path() == str(tmp_path)


def test_a_file_where_the_checkpoint_folder_goes_is_one_line_and_left_as_it_is(tmp_path):
    from trialflow.tuners.custom import dispatcher_environment

    (tmp_path / "checkpoint").write_text("someone's notes")
    with pytest.raises(TunerError, match=r"checkpoint folder .*checkpoint cannot be made \(File exists\): move"):
        with dispatcher_environment(tmp_path):
            pass
    assert (tmp_path / "checkpoint").read_text() == "someone's notes"


@pytest.mark.usefixtures("prefect_server")
def test_two_experiments_running_in_one_process_each_keep_their_checkpoint_folder(tmp_path):
    """As in a notebook running two experiments at once, each with a customized tuner: the process has one
    NNI_CHECKPOINT_DIRECTORY (the later experiment's), yet each tuner saves in its own experiment's folder;
    after both the variables are as they were before."""
    folder = tmp_path / "my_algorithms"
    folder.mkdir()
    shutil.copy(ALGORITHMS / "checkpoint_tuner.py", folder)
    before = {name: os.environ.get(name) for name in ("NNI_CHECKPOINT_DIRECTORY", "NNI_MODE")}
    configs, logs = {}, {}
    for name, factor in (("a", 10), ("b", 100)):
        gate, logs[name] = tmp_path / f"go-{name}", tmp_path / f"calls-{name}.jsonl"
        write_trial(tmp_path / f"code-{name}", f"""
            import os, time, nni
            p = nni.get_next_parameter()
            while not os.path.exists({str(gate)!r}):  # held until the test lets this experiment's trials end
                time.sleep(0.05)
            nni.report_final_result(p["x"] * {factor})
            """)
        configs[name] = base_config(tmp_path / f"code-{name}", tmp_path / "w", maxTrialNumber=2, trialConcurrency=1,
                                    tuner={"className": "checkpoint_tuner.SavingTuner", "codeDirectory": str(folder),
                                           "classArgs": {"log_file": str(logs[name])}})

    def opened(name: str) -> dict:  # the tuner's first call: its experiment's context is open
        return wait_for(lambda: logs[name].exists() and json.loads(logs[name].read_text().splitlines()[0]),
                        timeout=120)

    first, first_outcome = run_in_thread(lambda: run_experiment(configs["a"]))
    folder_a = opened("a")["path"]
    second, second_outcome = run_in_thread(lambda: run_experiment(configs["b"]))
    folder_b = opened("b")["path"]
    assert folder_a != folder_b and os.environ["NNI_CHECKPOINT_DIRECTORY"] == folder_b
    (tmp_path / "go-a").touch()  # a's results arrive, and its tuner saves them, while b still runs
    first.join(timeout=240)
    (tmp_path / "go-b").touch()
    second.join(timeout=240)
    for outcome in (first_outcome, second_outcome):
        assert outcome["result"].status == "DONE"
        assert [t.status for t in outcome["result"].trials] == ["SUCCEEDED"] * 2
    assert json.loads((Path(folder_a) / "tuner.json").read_text()) == {"0": 10, "1": 20}
    assert json.loads((Path(folder_b) / "tuner.json").read_text()) == {"0": 100, "1": 200}
    assert {name: os.environ.get(name) for name in before} == before


# A tuner that keeps its search space in its code, as NNI's examples/tuners/ga_customer_tuner does.
HARD_CODED_TUNER = """
from nni.tuner import Tuner


class HardCodedTuner(Tuner):
    def __init__(self, optimize_mode="maximize"):
        super().__init__()

    def update_search_space(self, search_space):
        self.given = search_space

    def generate_parameters(self, parameter_id, **kwargs):
        return {"layers": [{"type": parameter_id % 3, "output": [parameter_id + 1]}], "given": self.given}

    def receive_trial_result(self, parameter_id, parameters, value, **kwargs):
        pass
"""


@pytest.mark.usefixtures("prefect_server")
def test_nnis_ga_squad_config_with_its_space_hard_coded_in_the_tuner_runs(tmp_path):
    """NNI's examples/trials/ga_squad/config.yml, as written there (but its trial and budget): the
    space is ``{}`` and the customized tuner sends parameters of its own making."""
    (tmp_path / "tuners" / "ga_customer_tuner").mkdir(parents=True)
    (tmp_path / "tuners" / "ga_customer_tuner" / "customer_tuner.py").write_text(HARD_CODED_TUNER)
    write_trial(tmp_path / "trials" / "ga_squad", """
        import nni
        graph = nni.get_next_parameter()
        nni.report_final_result(float(graph["layers"][0]["output"][0]))
        """)
    config = tmp_path / "trials" / "ga_squad" / "config.yml"
    config.write_text(f"""\
trialCommand: python3 trial.py
trialGpuNumber: 0
trialConcurrency: 1
maxTrialNumber: 3
maxExperimentDuration: 1h
searchSpace: {{}}  # hard-coded in tuner
tuner:
  className: customer_tuner.CustomerTuner
  codeDirectory: ../../tuners/ga_customer_tuner
  classArgs:
    optimize_mode: maximize
trainingService:  # For other platforms, check mnist-pytorch example
  platform: local
experimentWorkingDirectory: {tmp_path / "w"}
""".replace("CustomerTuner", "HardCodedTuner"))
    result = run_experiment(str(config))
    assert result.status == "DONE" and [t.status for t in result.trials] == ["SUCCEEDED"] * 3
    assert [t.parameters for t in result.trials] == [
        {"layers": [{"type": i % 3, "output": [i + 1]}], "given": {}} for i in range(3)]
    assert [t.final for t in result.trials] == [1.0, 2.0, 3.0]
