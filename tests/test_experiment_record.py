"""The experiment record is right: each trial's own outcome, the best trial under the experiment's one
stored direction, the experiment's own config, no trial left running, imported data apart from
trials, every path absolute, a log for every run. Each rule is held by tests driven through real
local trials, the CLI and the flow as users drive them."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from prefect.states import Failed

from tests.conftest import base_config, write_trial
from tests.test_cli import cli
from tests.test_results import SKLEARN_LIKE
from trialflow.config import load_config, parse_config
from trialflow.experiments import ConfigMismatch, create_experiment, open_store
from trialflow.flows.experiment import experiment_flow, final_status
from trialflow.records.store import ExperimentStore
from trialflow.trial.verdicts import VERDICT_WAIT_SECONDS

pytestmark = pytest.mark.usefixtures("prefect_server")

STOP_AT = '''
import time

from nni.assessor import Assessor, AssessResult


class StopAt(Assessor):
    """Stops a trial once it reported ``after`` results, or as soon as one is below ``below``; each
    verdict takes ``think`` seconds (as a curve-fitting assessor's may)."""

    def __init__(self, after=1000, below=None, think=0):
        self.after, self.below, self.think = after, below, think

    def assess_trial(self, trial_job_id, trial_history):
        time.sleep(self.think)
        if len(trial_history) >= self.after or (self.below is not None and trial_history[-1] < self.below):
            return AssessResult.Bad
        return AssessResult.Good
'''


def _assessor(tmp_path: Path, **args) -> dict:
    write_trial(tmp_path / "algo", STOP_AT, "stop_at.py")
    return {"className": "stop_at.StopAt", "codeDirectory": str(tmp_path / "algo"), "classArgs": args}


def _run(config: dict):
    """Create and run the experiment; (experiment id, store, the run's final state)."""
    exp_id, exp_dir = create_experiment(parse_config(config))
    state = experiment_flow(None, exp_id, str(exp_dir.parent), return_state=True)
    return exp_id, open_store(exp_dir.parent, exp_id), state


# ---- the assessor never overwrites an outcome ----------------------------------------------------

# A trial that does not ask the assessor as it reports (as one started by an earlier controller, or on
# a platform without report-time decisions): its results and its end are read together -- or, where a poll
# comes between its last report and its exit (a busy machine can hold a process that long), its exit comes
# while the assessor decides, before the stop: either way it keeps its outcome.
ENDS_AFTER_THREE = """
import json, os, time, nni
os.environ.pop("TRIALFLOW_REPORT_DESK", None)
p = nni.get_next_parameter()
time.sleep(0.6)
for i in range(3):
    nni.report_intermediate_result(i)
if p["code"] == 0:
    nni.report_final_result(p["code"] + 10)
os._exit(p["code"])  # at once: the results and the exit mostly reach the controller in one poll
"""


def test_a_trial_that_ended_keeps_its_outcome_though_the_assessor_would_stop_it(tmp_path):
    code = tmp_path / "code"
    write_trial(code, ENDS_AFTER_THREE)
    config = base_config(code, tmp_path / "w", maxTrialNumber=2, searchSpace={"code": {"_type": "choice",
                         "_value": [0, 1]}}, tuner={"name": "GridSearch"},
                         assessor=_assessor(tmp_path, after=3, think=1.0))
    _, store, _ = _run(config)
    by_code = {t.parameters["code"]: t for t in store.trials()}
    assert by_code[1].status == "FAILED" and by_code[1].exit_code == 1
    assert by_code[0].status == "SUCCEEDED" and by_code[0].exit_code == 0 and by_code[0].final == 10


def test_a_running_trial_stopped_by_the_assessor_records_the_kill_exit_code(tmp_path):
    code = tmp_path / "code"
    write_trial(code, "import time, nni\nnni.get_next_parameter()\nfor i in range(3):\n"
                      "    nni.report_intermediate_result(i)\ntime.sleep(60)\n")
    _, store, _ = _run(base_config(code, tmp_path / "w", maxTrialNumber=1, assessor=_assessor(tmp_path, after=3)))
    (trial,) = store.trials()
    assert trial.status == "EARLY_STOPPED"
    assert trial.exit_code is not None and not 0 <= trial.exit_code < 128  # killed by a signal, and recorded
    assert [m.value for m in store.metrics(trial.id, "PERIODICAL")] == [0, 1, 2]
    assert trial.start_time is not None and trial.end_time >= max(m.time for m in store.metrics(trial.id))


LINGERS_AFTER_ITS_FINAL = """
import os, time, nni
nni.get_next_parameter()
for i in range(2):
    nni.report_intermediate_result(i)
nni.report_final_result(42)
began = time.monotonic()
nni.report_intermediate_result(2)  # the one the assessor judges on: a poll that brings it brings the final
with open(os.path.join(os.environ["NNI_OUTPUT_DIR"], "after_final_report"), "w") as f:
    f.write(str(time.monotonic() - began))
time.sleep(2)  # saving a model, cleaning up
"""


def test_a_trial_whose_final_result_is_in_is_not_stopped_by_the_assessor(tmp_path):
    """Its work is done: it ends with its own outcome, however the assessor would judge its results; a
    result it reports after its final one is not held at the report desk (nothing is judged any more)."""
    code = tmp_path / "code"
    write_trial(code, LINGERS_AFTER_ITS_FINAL)
    exp_id, store, _ = _run(base_config(code, tmp_path / "w", maxTrialNumber=2,
                                        assessor=_assessor(tmp_path, after=3)))
    for trial in store.trials():
        assert (trial.status, trial.exit_code, trial.final) == ("SUCCEEDED", 0, 42), trial.message
        assert [m.value for m in store.metrics(trial.id, "PERIODICAL")] == [0, 1, 2]
        held = float((tmp_path / "w" / exp_id / "trials" / trial.id / "after_final_report").read_text())
        assert held < VERDICT_WAIT_SECONDS / 2, f"the report after the final result waited {held:.1f} s for a word"


def test_a_trial_past_its_max_duration_after_its_final_result_is_stopped_and_keeps_it(tmp_path):
    """maxTrialDuration still ends a trial that lingers; its result, reported before, stands."""
    code = tmp_path / "code"
    write_trial(code, "import time, nni\nnni.get_next_parameter()\nnni.report_final_result(7)\ntime.sleep(60)\n")
    _, store, _ = _run(base_config(code, tmp_path / "w", maxTrialNumber=1, maxTrialDuration="2s"))
    (trial,) = store.trials()
    assert (trial.status, trial.final, trial.exit_code) == ("SUCCEEDED", 7, None)
    assert trial.message == "stopped at maxTrialDuration after its final result"
    assert trial.end_time - trial.start_time < 30  # stopped, not waited for
    assert store.experiment().best_trial == trial.id


# ---- one stored direction, NNI's rule ------------------------------------------------------------
# (the rule itself, without a server: tests/test_results.py)

def test_nni_sklearn_example_shape_names_the_highest_accuracy_best_everywhere(tmp_path):
    """NNI's sklearn-classification.yml: Random tuner without optimize_mode, Medianstop maximize."""
    code = tmp_path / "code"
    write_trial(code, SKLEARN_LIKE)
    accuracies = [0.8822, 0.9867, 0.9311]
    config = base_config(code, tmp_path / "w", maxTrialNumber=3, tuner={"name": "GridSearch"},
                         assessor={"name": "Medianstop", "classArgs": {"optimize_mode": "maximize"}},
                         searchSpace={"accuracy": {"_type": "choice", "_value": accuracies}})
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(config))
    env = {"TRIALFLOW_HOME": str(tmp_path / "w")}
    proc = cli("create", "--config", str(path), "--foreground", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    exp_id = proc.stdout.split("experiment id:")[1].split()[0]
    assert "value 0.9867" in proc.stdout  # the final summary
    store = open_store(tmp_path / "w", exp_id)
    record = store.experiment()
    assert record.optimize_mode == "maximize"
    best_id = next(t.id for t in store.trials() if t.final == 0.9867)
    assert record.best_trial == best_id
    assert f"best trial: {best_id}" in cli("view", exp_id, env=env).stdout
    head = cli("trial", "ls", exp_id, "--head", "1", env=env).stdout
    assert best_id in head and "0.8822" not in head
    tail = cli("trial", "ls", exp_id, "--tail", "1", env=env).stdout
    assert "0.8822" in tail


# ---- a stored experiment runs with its own config ------------------------------------------------

def test_a_config_of_another_experiment_is_refused_and_the_experiment_is_untouched(tmp_path):
    code = tmp_path / "code"
    write_trial(code, SKLEARN_LIKE)
    mine = base_config(code, tmp_path / "w", maxTrialNumber=2,
                       searchSpace={"accuracy": {"_type": "choice", "_value": [0.5, 0.6]}})
    mine_path = tmp_path / "mine.yml"
    mine_path.write_text(yaml.safe_dump(mine))
    other_path = tmp_path / "other.yml"
    other_path.write_text(yaml.safe_dump({**mine, "maxTrialNumber": 9, "trialCommand": "python3 model.py"}))
    exp_id, exp_dir = create_experiment(load_config(mine_path), str(mine_path))
    with pytest.raises(ConfigMismatch) as refused:
        experiment_flow(str(other_path), exp_id, str(exp_dir.parent))
    assert "maxTrialNumber" in str(refused.value) and "trialCommand" in str(refused.value)
    store = open_store(exp_dir.parent, exp_id)
    assert store.count_trials() == 0 and store.experiment().status == "INITIALIZED"
    # with its own file, or with none, it runs
    assert experiment_flow(str(mine_path), exp_id, str(exp_dir.parent)) == "DONE"
    assert store.count_trials() == 2


def test_an_edited_config_file_does_not_change_a_resumed_experiment(tmp_path):
    code = tmp_path / "code"
    write_trial(code, SKLEARN_LIKE)
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(base_config(code, tmp_path / "w", maxTrialNumber=2, tuner={"name": "GridSearch"},
                                               searchSpace={"accuracy": {"_type": "choice", "_value": [1, 2]}})))
    exp_id, exp_dir = create_experiment(load_config(path), str(path))
    path.write_text(yaml.safe_dump(base_config(code, tmp_path / "w", maxTrialNumber=7,
                                               searchSpace={"accuracy": {"_type": "choice", "_value": [5]}})))
    from trialflow.experiments import LIVE_CONFIGS
    LIVE_CONFIGS.pop(exp_id)  # as a later process sees it
    assert experiment_flow(None, exp_id, str(exp_dir.parent)) == "DONE"
    trials = open_store(exp_dir.parent, exp_id).trials()
    assert sorted(t.final for t in trials) == [1, 2]


# ---- data that cannot be stored is rejected, never fatal -----------------------------------------

HOSTILE_METRICS = r"""
import json, os, nni
nni.get_next_parameter()
nni.report_intermediate_result(10**400)
nni.report_intermediate_result(0.5)
path = os.path.join(os.environ["NNI_SYS_DIR"], ".nni", "metrics")
def frame(record):
    payload = (json.dumps(record) + "\n").encode()
    return b"ME" + b"%06d" % len(payload) + payload
with open(path, "ab") as f:
    trial = os.environ["NNI_TRIAL_JOB_ID"]
    f.write(frame({"trial_job_id": trial, "type": "PERIODICAL", "sequence": 2**64, "value": "1"}))
    f.write(frame({"trial_job_id": trial, "type": "PERIODICAL", "sequence": 7, "value": "[" * 5000 + "]" * 5000}))
nni.report_final_result(0.75)
"""


def test_unstorable_metrics_are_rejected_and_the_trial_keeps_its_outcome(tmp_path, caplog):
    code = tmp_path / "code"
    write_trial(code, HOSTILE_METRICS)
    env = {"TRIALFLOW_HOME": str(tmp_path / "w")}
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(base_config(code, tmp_path / "w", maxTrialNumber=2)))
    proc = cli("create", "--config", str(path), "--foreground", env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    exp_id = proc.stdout.split("experiment id:")[1].split()[0]
    store = open_store(tmp_path / "w", exp_id)
    assert store.experiment().status == "DONE"
    for trial in store.trials():
        assert trial.status == "SUCCEEDED" and trial.final == 0.75 and trial.exit_code == 0
        assert trial.end_time - trial.start_time < 30  # not ~130 s of "platform unreachable" retries
        assert [m.value for m in store.metrics(trial.id, "PERIODICAL")] == [0.5]
    log = (tmp_path / "w" / exp_id / "log" / "experiment.log").read_text()
    assert "out of range" in log and "nested more than" in log and "sequence must be a non-negative integer" in log
    for args in (["trial", "ls", exp_id, "--head", "1"], ["view", exp_id]):
        shown = cli(*args, env=env)
        assert shown.returncode == 0 and "0.75" in shown.stdout, shown.stdout + shown.stderr


def test_a_value_no_float_holds_cannot_be_imported(tmp_path):
    code = tmp_path / "code"
    write_trial(code, SKLEARN_LIKE)
    exp_id, exp_dir = create_experiment(parse_config(base_config(
        code, tmp_path / "w", searchSpace={"accuracy": {"_type": "choice", "_value": [1]}})))
    data = tmp_path / "data.json"
    data.write_text('[{"parameter": {"accuracy": 1}, "value": 1}, {"parameter": {"accuracy": 1}, "value": 1'
                    + "0" * 400 + "}]")
    env = {"TRIALFLOW_HOME": str(tmp_path / "w")}
    proc = cli("experiment", "import", exp_id, "-f", str(data), env=env)
    assert proc.returncode == 1 and "item 1: 'value'" in proc.stdout and "Traceback" not in proc.stderr
    assert open_store(exp_dir.parent, exp_id).imported() == []  # all or nothing
    assert cli("view", exp_id, env=env).returncode == 0


def test_no_error_in_following_a_trial_leaves_it_running(tmp_path, monkeypatch):
    code = tmp_path / "code"
    write_trial(code, "import time, nni\nnni.get_next_parameter()\nnni.report_intermediate_result(1)\n"
                      "time.sleep(0.5)\nnni.report_final_result(1)\n")
    real_add = ExperimentStore.add_metrics
    calls = {"n": 0}

    def add_metrics(self, records):
        calls["n"] += 1
        if calls["n"] == 1:
            raise OverflowError("a bug nobody foresaw")
        return real_add(self, records)

    monkeypatch.setattr(ExperimentStore, "add_metrics", add_metrics)
    _, store, _ = _run(base_config(code, tmp_path / "w", maxTrialNumber=3, trialConcurrency=1))
    assert store.experiment().status == "DONE"
    statuses = [t.status for t in store.trials()]
    assert "RUNNING" not in statuses and "WAITING" not in statuses
    broken = [t for t in store.trials() if t.status == "FAILED"]
    assert len(broken) == 1 and "could not follow the trial (OverflowError" in broken[0].message


# ---- every trial that ran has its start and end --------------------------------------------------

def test_short_trials_all_have_start_and_end_times(tmp_path):
    code = tmp_path / "code"
    write_trial(code, "import os, nni\nnni.get_next_parameter()\nnni.report_final_result(1)\nos._exit(0)\n")
    _, store, _ = _run(base_config(code, tmp_path / "w", maxTrialNumber=16, trialConcurrency=4))
    trials = store.trials()
    assert len(trials) == 16
    for trial in trials:
        assert trial.start_time is not None and trial.end_time is not None and trial.start_time <= trial.end_time
        assert [h[0] for h in store.status_history(trial.id)] == ["WAITING", "RUNNING", "SUCCEEDED"]


# ---- an experiment in which nothing succeeded says so --------------------------------------------

def test_all_trials_failed_is_done_but_the_run_fails_and_the_cli_exits_1(tmp_path):
    code = tmp_path / "code"
    write_trial(code, "import sys, nni\nnni.get_next_parameter()\nprint('ValueError: lr too high', file=sys.stderr)\n"
                      "sys.exit(3)\n")
    exp_id, store, state = _run(base_config(code, tmp_path / "w", maxTrialNumber=3))
    assert store.experiment().status == "DONE"  # NNI's status
    assert state.is_failed() and "no trial succeeded, 3 failed" in state.message
    last = store.trials()[-1]  # what it said, and where to read the rest
    assert last.message == "exit code 3; stderr tail:\nValueError: lr too high"  # on one line, and once:
    assert (f"(trial {last.id}: exit code 3; stderr: ValueError: lr too high); its output: trialflow log trial "
            f"{exp_id} {last.id}") in state.message
    assert final_status(state, exp_id, tmp_path / "w") == "DONE"
    # the API's copy of that state (no data), which Prefect's engine hands back when the final state was
    # sent twice (its first answer lost to an API that stalled past the client's timeout): the record says
    copy = Failed(message=state.message)
    assert copy.data is None and final_status(copy, exp_id, tmp_path / "w") == "DONE"
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(base_config(code, tmp_path / "w2", maxTrialNumber=2)))
    proc = cli("create", "--config", str(path), "--foreground", env={"TRIALFLOW_HOME": str(tmp_path / "w2")})
    assert proc.returncode == 1
    assert "2 trials: 2 FAILED" in proc.stdout
    assert "error: experiment" in proc.stdout and "no trial succeeded, 2 failed" in proc.stdout
    (error,) = [line for line in proc.stdout.splitlines() if "no trial succeeded" in line]  # one line, the tail once
    assert error.startswith("error: experiment") and error.count("ValueError: lr too high") == 1
    assert "; stderr: ValueError: lr too high); its output: trialflow log trial" in error


def test_a_notebook_run_where_nothing_succeeded_still_returns_its_result(tmp_path):
    import trialflow

    code = tmp_path / "code"
    write_trial(code, "import sys, nni\nnni.get_next_parameter()\nsys.exit(2)\n")
    result = trialflow.run_experiment(base_config(code, tmp_path / "w", maxTrialNumber=2))
    assert result.status == "DONE" and result.best is None
    assert [t.status for t in result.trials] == ["FAILED", "FAILED"]


# ---- imported data go to the tuner, not into the trials ------------------------------------------

def test_imported_data_count_toward_no_budget_and_are_never_the_best_trial(tmp_path):
    code = tmp_path / "code"
    write_trial(code, SKLEARN_LIKE)
    config = base_config(code, tmp_path / "w", maxTrialNumber=3, tuner={"name": "GridSearch"},
                         searchSpace={"accuracy": {"_type": "choice", "_value": [0.1, 0.2, 0.3, 0.4, 0.5]}})
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(config))
    exp_id, exp_dir = create_experiment(load_config(path), str(path))
    data = tmp_path / "data.json"
    data.write_text(json.dumps([{"parameter": {"accuracy": 0.5}, "value": 0.99},
                                {"parameter": {"accuracy": 0.4}, "value": "0.98"}]))
    env = {"TRIALFLOW_HOME": str(tmp_path / "w")}
    proc = cli("experiment", "import", exp_id, "-f", str(data), env=env)
    assert proc.returncode == 0 and "imported 2" in proc.stdout, proc.stdout
    assert experiment_flow(None, exp_id, str(exp_dir.parent)) == "DONE"
    store = open_store(exp_dir.parent, exp_id)
    trials = store.trials()
    assert sorted(t.parameters["accuracy"] for t in trials) == [0.1, 0.2, 0.3]  # the grid skipped them
    assert [t.sequence for t in trials] == [0, 1, 2]
    view = cli("view", exp_id, env=env).stdout
    assert "trials: 3 / 3" in view and "value 0.3" in view and "0.99" not in view
    assert store.experiment().best_trial == next(t.id for t in trials if t.final == 0.3)


# ---- CSV export with intermediate results --------------------------------------------------------

def test_csv_export_with_intermediate_results(tmp_path):
    code = tmp_path / "code"
    write_trial(code, "import nni\np = nni.get_next_parameter()\nfor i in range(3):\n"
                      "    nni.report_intermediate_result(p['x'] + i)\nnni.report_final_result(p['x'])\n")
    exp_id, store, _ = _run(base_config(code, tmp_path / "w", maxTrialNumber=2))
    env = {"TRIALFLOW_HOME": str(tmp_path / "w")}
    out = tmp_path / "out.csv"
    assert cli("experiment", "export", exp_id, "-f", str(out), "-t", "csv", "-i", env=env).returncode == 0
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 2
    for row in rows:
        x = float(row["x"])
        assert json.loads(row["intermediate"]) == pytest.approx([x, x + 1, x + 2])
        assert " " not in row["intermediate"]  # nnictl's "[" + ",".join(results) + "]"
        assert float(row["reward"]) == pytest.approx(x)
    plain = tmp_path / "plain.csv"
    assert cli("experiment", "export", exp_id, "-f", str(plain), "-t", "csv", env=env).returncode == 0
    assert "intermediate" not in plain.read_text().splitlines()[0]


def test_export_holds_every_trial_with_its_status_and_imports_back(tmp_path):
    """An early-stopped trial is in the export with its status and intermediate results (value null);
    importing the export into another experiment tells the tuner the trials that have results."""
    code = tmp_path / "code"
    write_trial(code, "import time, nni\np = nni.get_next_parameter()\nnni.report_intermediate_result(p['x'])\n"
                      "time.sleep(30 if p['x'] < 0.5 else 0)\nnni.report_final_result(p['x'])\n")
    space = {"x": {"_type": "choice", "_value": [0.2, 0.8]}}
    exp_id, store, _ = _run(base_config(code, tmp_path / "w", maxTrialNumber=2, searchSpace=space,
                                        tuner={"name": "GridSearch"}, assessor=_assessor(tmp_path, below=0.5)))
    env = {"TRIALFLOW_HOME": str(tmp_path / "w")}
    out = tmp_path / "out.json"
    assert cli("experiment", "export", exp_id, "-f", str(out), "-i", env=env).returncode == 0
    rows = {r["parameter"]["x"]: r for r in json.loads(out.read_text())}
    assert (rows[0.2]["status"], rows[0.2]["value"], rows[0.2]["intermediate"]) == ("EARLY_STOPPED", None, ["0.2"])
    assert (rows[0.8]["status"], json.loads(rows[0.8]["value"])) == ("SUCCEEDED", 0.8)
    csv_out = tmp_path / "out.csv"
    assert cli("experiment", "export", exp_id, "-f", str(csv_out), "-t", "csv", env=env).returncode == 0
    table = {float(r["x"]): r for r in csv.DictReader(csv_out.open())}
    assert (table[0.2]["status"], table[0.2]["reward"]) == ("EARLY_STOPPED", "")
    other, _ = create_experiment(parse_config(base_config(code, tmp_path / "w2", searchSpace=space)))
    imported = cli("experiment", "import", other, "-f", str(out), "--root", str(tmp_path / "w2"), env=env)
    assert imported.returncode == 0, imported.stdout + imported.stderr
    assert len(open_store(tmp_path / "w2", other).imported()) == 1


# ---- a relative --root ---------------------------------------------------------------------------

def test_resume_with_a_relative_root_runs_its_trials(tmp_path):
    code = tmp_path / "code"
    write_trial(code, "import nni\np = nni.get_next_parameter()\nnni.report_final_result(p['x'])\n")
    exp_id, _ = create_experiment(parse_config(base_config(code, tmp_path / "w", maxTrialNumber=2)))
    proc = subprocess.run([sys.executable, "-m", "trialflow.cli", "resume", exp_id, "--root", "w", "--foreground"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "COLUMNS": "200", "TRIALFLOW_HOME": str(tmp_path / "elsewhere")})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    trials = open_store(tmp_path / "w", exp_id).trials()
    assert [t.status for t in trials] == ["SUCCEEDED", "SUCCEEDED"]
    assert all(Path(t.log_dir).is_absolute() for t in trials)


# ---- every run leaves its controller log ---------------------------------------------------------

def _two_trial_config(tmp_path: Path) -> Path:
    """A config file for two trials that report one final result each, working under tmp_path/w."""
    code = tmp_path / "code"
    write_trial(code, "import nni\nnni.get_next_parameter()\nnni.report_final_result(1)\n")
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(base_config(code, tmp_path / "w", maxTrialNumber=2)))
    return path


def test_a_foreground_run_leaves_its_log_in_the_experiment_folder(tmp_path):
    path = _two_trial_config(tmp_path)
    proc = cli("create", "--config", str(path), "--foreground", env={"TRIALFLOW_HOME": str(tmp_path / "w")})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    exp_id = proc.stdout.split("experiment id:")[1].split()[0]
    log = (tmp_path / "w" / exp_id / "log" / "experiment.log").read_text()
    assert f"experiment {exp_id} running on local" in log
    assert f"experiment {exp_id} DONE: 2 trials: 2 SUCCEEDED" in log
    assert "trial-" in log  # task runs are named


def test_the_terminal_keeps_prefect_logging_level_while_the_log_keeps_info(tmp_path):
    """run_experiment() from a script with PREFECT_LOGGING_LEVEL=WARNING: no INFO line per task run
    ("Finished in state ...") in the terminal, while the experiment's log still has them."""
    path = _two_trial_config(tmp_path)
    script = f"from trialflow import run_experiment\nprint('id', run_experiment({str(path)!r}).experiment_id)\n"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180,
                          env={**os.environ, "PREFECT_LOGGING_LEVEL": "WARNING"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    exp_id = proc.stdout.split("id ")[1].split()[0]
    log = (tmp_path / "w" / exp_id / "log" / "experiment.log").read_text()
    assert "Finished in state" in log and f"experiment {exp_id} DONE" in log
    assert "Finished in state" not in proc.stderr and f"experiment {exp_id} DONE" not in proc.stderr, proc.stderr


# ---- the randomized timing test ------------------------------------------------------------------

TIMED_TRIAL = textwrap.dedent("""
    import json, os, random, sys, time, nni
    p = nni.get_next_parameter()
    rng = random.Random(p["case"])
    journal = open(os.path.join(os.environ["NNI_SYS_DIR"], "journal.jsonl"), "a")
    def note(**entry):
        journal.write(json.dumps(entry) + "\\n")
        journal.flush()
    for i in range(rng.randint(0, 4)):
        time.sleep(rng.choice([0, 0, 0.01, 0.05, 0.1, 0.19, 0.21, 0.3]))
        value = rng.random()
        note(kind="PERIODICAL", value=value)  # noted first: a kill between the two leaves the journal ahead
        nni.report_intermediate_result(value)
    time.sleep(rng.choice([0, 0, 0.02, 0.2]))
    if rng.random() < 0.7:
        final = rng.random()
        note(kind="FINAL", value=final)
        nni.report_final_result(final)
        time.sleep(rng.choice([0, 0, 0.1, 0.3, 0.6]))  # lingers after its final result (saving, cleaning up)
    code = rng.choice([0, 0, 0, 1, 2, 3])
    note(kind="exit", code=code)
    if rng.random() < 0.5:
        os._exit(code)
    sys.exit(code)
""")


@pytest.mark.parametrize("platform, seed", [("local", 1), *(("memory", seed) for seed in range(1, 4))])
def test_randomized_timing_keeps_every_invariant(tmp_path, request, platform, seed):
    """Trials report k intermediates, maybe a final (and linger after it), then exit with a random code
    at random moments relative to the poll interval, under an assessor that stops half of what it sees; 80 seeded cases
    per run. Besides the audit (run after every test), each trial's record must match what it did. One
    seed runs real processes (races of the file protocol); three more play in virtual time on the
    in-memory service, where each sleep is a step between the flow's polls."""
    if platform == "memory":
        request.getfixturevalue("memory_platform")
    code = tmp_path / "code"
    write_trial(code, TIMED_TRIAL)
    config = base_config(code, tmp_path / "w", maxTrialNumber=80, trialConcurrency=8,
                         trainingService={"platform": platform},
                         searchSpace={"case": {"_type": "randint", "_value": [0, 10**9]}},
                         tuner={"name": "Random", "classArgs": {"seed": seed}},
                         assessor=_assessor(tmp_path, below=0.5))
    exp_id, store, _ = _run(config)
    trials = store.trials()
    record = store.experiment()
    log = tmp_path / "w" / exp_id / "log" / "experiment.log"
    assert len(trials) == 80 and record.status == "DONE", (record.status, record.message, log.read_text()[-3000:])
    seen = set()
    for trial in trials:
        journal = [json.loads(x) for x in (Path(trial.log_dir) / "journal.jsonl").read_text().splitlines()]
        chosen = [e["code"] for e in journal if e["kind"] == "exit"]
        periodical = [m.value for m in store.metrics(trial.id, "PERIODICAL")]
        reported = [e["value"] for e in journal if e["kind"] == "PERIODICAL"]
        assert periodical == reported[:len(periodical)], trial.id  # what it reported, in order
        where = (trial.id, trial.status, trial.exit_code, journal)
        if trial.exit_code is None:  # it exited with a code of its own while the assessor's stop reached it
            # alive (the keeper's state says stop_signal): that exit answered the stop, and its code is not
            # the trial's outcome (trialdir.ended_update). A trial cannot say whether it ended by itself or
            # because of the signal, so the stop stands.
            assert trial.status == "EARLY_STOPPED" and len(chosen) <= 1, where
            assert any(v < 0.5 for v in periodical), where
            seen.add(trial.status)
            continue
        if 0 <= trial.exit_code < 128:  # it ended by itself: its own outcome stands, whatever the assessor thought
            assert chosen == [trial.exit_code], where
            assert trial.status == ("SUCCEEDED" if trial.exit_code == 0 else "FAILED"), where
            assert periodical == reported, where
            finals = [e["value"] for e in journal if e["kind"] == "FINAL"]
            assert trial.final == (finals[0] if finals else None), where
        else:  # killed: only the assessor does that here, on a result below 0.5, before its final was
            assert trial.status == "EARLY_STOPPED", where  # recorded (the audit checks the order)
            assert any(v < 0.5 for v in periodical), where
        seen.add(trial.status)
    assert {"SUCCEEDED", "FAILED", "EARLY_STOPPED"} <= seen  # every path was taken


# ---- a shared store's password stays in the config file ------------------------------------------

def test_a_shared_store_password_is_never_written_and_later_commands_find_it_in_the_config(tmp_path,
                                                                                           postgres_server):
    code = tmp_path / "code"
    write_trial(code, SKLEARN_LIKE)
    sentinel = "S3CRET-sentinel-4f1c"
    url = postgres_server.url.replace("@", f":{sentinel}@", 1)
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(base_config(code, tmp_path / "w", maxTrialNumber=1, storeUrl=url,
                                               searchSpace={"accuracy": {"_type": "choice", "_value": [1]}})))
    exp_id, exp_dir = create_experiment(load_config(path), str(path))
    recorded = exp_dir / "db" / "store-url"
    assert sentinel not in recorded.read_text() and recorded.read_text().strip() == postgres_server.url
    assert recorded.stat().st_mode & 0o777 == 0o600
    assert not [f for f in exp_dir.rglob("*") if f.is_file() and sentinel in f.read_text(errors="replace")]
    # a later process, with neither the config in memory nor PGPASSWORD, takes the password from the file
    env = {k: v for k, v in os.environ.items() if k != "PGPASSWORD"}
    shown = subprocess.run([sys.executable, "-c", "import sys; from trialflow.experiments import open_store; "
                            "print(open_store(sys.argv[1], sys.argv[2]).url)", str(exp_dir.parent), exp_id],
                           capture_output=True, text=True, env=env, timeout=60)
    assert shown.returncode == 0 and sentinel in shown.stdout, shown.stderr
    assert experiment_flow(None, exp_id, str(exp_dir.parent)) == "DONE"
