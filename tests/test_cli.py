"""The ``trialflow`` command line, run as a user would (subprocesses)."""

from __future__ import annotations

import csv
import json
import os
import pty
import re
import subprocess
import sys
import time
from contextlib import suppress
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from tests.conftest import base_config, nnictl_list_rows, write_trial
from trialflow.experiments import open_store
from trialflow.testing.ports import free_port


def cli(*args: str, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "COLUMNS": "200", **(env or {})}
    return subprocess.run([sys.executable, "-m", "trialflow.cli", *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout)


def _config_file(tmp_path: Path, **overrides) -> Path:
    code = tmp_path / "code"
    write_trial(code, "import nni\np = nni.get_next_parameter()\nnni.report_intermediate_result(p['x'])\n"
                      "nni.report_final_result(p['x'])\n")
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(base_config(code, tmp_path / "w", **overrides)))
    return path


def test_each_command_list_gives_a_command_its_summary_as_one_sentence():
    """`trialflow --help` and each group's `--help` list every command with the first paragraph of its
    help as one run of text: on a terminal wide enough, one line each, with no break mid-sentence
    where the docstring's source line ended."""
    from trialflow.cli import app

    for group in [[], *([info.name] for info in app.registered_groups)]:
        out = cli(*group, "--help", env={"COLUMNS": "400"})
        assert out.returncode == 0, out.stderr
        panel = out.stdout.split("Commands ")[1].splitlines()[1:-1]
        assert panel, out.stdout
        continued = [row.strip("│ ") for row in panel if row.startswith("│  ")]  # its name column empty
        assert continued == [], f"trialflow {' '.join(group)} --help breaks a summary: {continued}"
        assert "``" not in out.stdout


def test_a_ctrl_c_while_the_command_starts_is_an_empty_line_and_exit_1_not_a_traceback():
    """Ctrl-C right after typing `trialflow create` (the console script still importing) ends it as a
    Ctrl-C inside any command does. The interrupt arrives at a fixed point of the start, not after a
    guessed delay."""
    start = ("import os, signal, sys; sys.argv = ['trialflow', 'experiment', 'list']; "
             "signal.signal(signal.SIGINT, signal.default_int_handler); "  # as a shell starts it (a test
             "from trialflow import console_script; "  # worker may pass SIGINT on ignored)
             "console_script.set_process_defaults = lambda: os.kill(os.getpid(), signal.SIGINT); "
             "console_script.main()")
    interrupted = subprocess.run([sys.executable, "-c", start], capture_output=True, text=True, timeout=60)
    assert interrupted.returncode == 1
    assert interrupted.stdout == "" and interrupted.stderr == "\n"


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_top_quits_on_a_signal_that_lands_while_python_runs_a_weakref_callback(tmp_path, sig):
    """`trialflow top` quits on one Ctrl-C (or SIGTERM) wherever in its refresh it lands. Python prints
    and drops an exception raised in a weakref callback or a destructor (a database library's cleanup
    runs such callbacks during a refresh), so a Ctrl-C that raised there left `top` running. Here the
    signal comes from inside a weakref callback during the first refresh, at a fixed point."""
    start = ("import os, signal, sys, weakref; import trialflow.presentation.views as views; "
             "table = views.running_table; calls = []\n"
             "def refresh(root, view=None):\n"
             "    calls.append(root)\n"
             "    if len(calls) == 2:\n"
             "        class Gone: pass\n"
             "        gone = Gone(); ref = weakref.ref(gone, lambda _: os.kill(os.getpid(), "
             f"signal.{sig})); del gone\n"
             "    return table(root, view)\n"
             "views.running_table = refresh\n"
             f"sys.argv = ['trialflow', 'top', '--time', '1', '--root', {str(tmp_path)!r}]\n"
             "from trialflow.console_script import main; main()\n")
    top = subprocess.run([sys.executable, "-c", start], capture_output=True, text=True, timeout=30,
                         env={**os.environ, "COLUMNS": "120"})  # before: it ran on until killed
    assert top.returncode == 0, top.stderr
    assert "Ctrl-C quits" in top.stdout and "running experiments at" in top.stdout
    assert top.stderr == ""  # nothing printed as an ignored exception

def test_missing_config_file(tmp_path):
    proc = cli("create", "--config", str(tmp_path / "nope.yml"))
    assert proc.returncode == 1
    assert "error: Invalid experiment config" in proc.stdout and "does not exist" in proc.stdout


def test_bad_yaml(tmp_path):
    path = tmp_path / "bad.yml"
    path.write_text("trialConcurrency: [1,\n")
    proc = cli("create", "--config", str(path))
    assert proc.returncode == 1 and "not valid YAML at line" in proc.stdout


def test_invalid_field_is_named(tmp_path):
    path = _config_file(tmp_path, trialConcurrency=-2)
    proc = cli("create", "--config", str(path))
    assert proc.returncode == 1 and "trialConcurrency: Input should be greater than 0 (got -2)" in proc.stdout


@pytest.mark.parametrize("args", [["view", "zzzzzzzz"], ["trial", "ls", "zzzzzzzz"], ["stop", "zzzzzzzz"],
                                  ["resume", "zzzzzzzz"], ["update", "concurrency", "zzzzzzzz", "3"]])
def test_unknown_experiment_id(args):
    proc = cli(*args)
    assert proc.returncode == 1 and "no experiment 'zzzzzzzz' found" in proc.stdout


@pytest.fixture(scope="module")
def finished(tmp_path_factory, prefect_server):
    """One experiment run to DONE through `trialflow create --foreground`."""
    tmp_path = tmp_path_factory.mktemp("cli")
    home = tmp_path / "home"
    env = {"PREFECT_API_URL": prefect_server, "TRIALFLOW_HOME": str(home)}
    path = _config_file(tmp_path, maxTrialNumber=4)
    proc = cli("create", "--config", str(path), "--foreground", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    exp_id = proc.stdout.split("experiment id:")[1].split()[0]
    return tmp_path, env, exp_id, proc.stdout


def _nnictl_time(text: str) -> datetime:
    """A time as nnictl prints it (``%Y/%m/%d %H:%M:%S``); raises ValueError for any other form."""
    return datetime.strptime(text, "%Y/%m/%d %H:%M:%S")


def test_create_foreground_runs_to_done_and_prints_best(finished):
    _, env, exp_id, out = finished
    assert "DONE" in out and "best trial" in out
    listing = cli("experiment", "list", "--all", env=env)
    assert exp_id in listing.stdout and "DONE" in listing.stdout


def test_experiment_list_into_a_pipe_is_nnictls_lines_with_every_value_whole_and_a_table_on_a_terminal(finished):
    """A script reads `experiment list` as it read nnictl's (`Id: ...    Name: ...` lines), nothing cut
    to the 80 columns a pipe gets; a person at a terminal gets the table."""
    tmp_path, env, exp_id, _ = finished
    piped = cli("experiment", "list", "--all", env={**env, "COLUMNS": ""})  # no width given: 80
    assert piped.returncode == 0 and piped.stdout.startswith("-" * 88 + "\n                Experiment information\n")
    shown = nnictl_list_rows(piped.stdout)[exp_id]
    assert list(shown) == ["Id", "Name", "Status", "Port", "Platform", "StartTime", "EndTime", "Trials", "Directory"]
    assert (shown["Status"], shown["Port"], shown["Platform"], shown["Trials"]) == ("DONE", "N/A", "local", "4")
    assert shown["Directory"] == str(tmp_path / "w" / exp_id)  # whole, where a table cut it
    start, end = (datetime.strptime(shown[key], "%Y-%m-%d %H:%M:%S") for key in ("StartTime", "EndTime"))
    assert start <= end <= datetime.now()

    leader, follower = pty.openpty()
    on_terminal = subprocess.run([sys.executable, "-m", "trialflow.cli", "experiment", "list", "--all"],
                                 stdout=follower, stderr=subprocess.PIPE, env={**os.environ, **env, "COLUMNS": "200"},
                                 timeout=60)
    os.close(follower)
    output = b""
    with suppress(OSError):  # the terminal read to its end
        while chunk := os.read(leader, 65536):
            output += chunk
    os.close(leader)
    table = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", output.decode())
    assert on_terminal.returncode == 0 and "Id: " not in table
    assert re.search(r"┃ id +┃ name +┃ status", table) and re.search(rf"│ {exp_id} +│ .* +│ DONE +│", table), table


def test_experiment_list_with_nothing_to_list_says_so_in_a_line(tmp_path):
    """As nnictl, a listing with no running experiment says so and how to see the ended ones, instead of
    printing an empty table."""
    env = {"TRIALFLOW_HOME": str(tmp_path / "w")}
    running = cli("experiment", "list", env=env)
    assert running.returncode == 0 and running.stdout.strip() == (
        "no experiment is running: `trialflow experiment list --all` lists all")
    every = cli("experiment", "list", "--all", env=env)
    assert every.returncode == 0 and every.stdout.strip() == "no experiment yet"


@pytest.mark.parametrize("what,value,message", [
    ("concurrency", "abc", "bad concurrency value 'abc': must be an integer from 1 to 1000"),
    ("concurrency", "0", "bad concurrency value 0: must be from 1 to 1000"),
    ("concurrency", "5000", "must be from 1 to 1000"),
    ("trialnum", "0", "bad trialnum value 0"),
    ("duration", "10x", "bad duration value"),
    ("duration", "0", "must be positive"),
])
def test_bad_update_values(finished, what, value, message):
    _, env, exp_id, _ = finished
    proc = cli("update", what, exp_id, value, env=env)
    assert proc.returncode == 1 and message in proc.stdout


def test_usage_errors_are_reported(finished):
    _, env, exp_id, _ = finished
    proc = cli("update", "trialnum", exp_id, "-1", env=env)
    assert proc.returncode == 2 and "No such option: -1" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("args, option, allowed", [
    (["trial", "ls", "{exp}", "--head", "-2"], "'--head'", "x>=1"),
    (["trial", "ls", "{exp}", "--tail", "0"], "'--tail'", "x>=1"),
    (["log", "stdout", "{exp}", "--tail", "0"], "'--tail' / '-T'", "x>=1"),
    (["log", "stderr", "{exp}", "-H", "-1"], "'--head' / '-H'", "x>=1"),
    (["log", "trial", "{exp}", "ZZZZZ", "--tail", "-5"], "'--tail'", "x>=1"),
    (["dashboard", "{exp}", "--port", "70000"], "'--port' / '-p'", "0<=x<=65535"),
    (["view", "{exp}", "--dashboard", "--dashboard-port", "-1"], "'--dashboard-port'", "0<=x<=65535"),
    (["tensorboard", "start", "{exp}", "--port", "70000"], "'--port'", "0<=x<=65535"),
])
def test_a_number_out_of_its_range_is_a_usage_error_naming_the_option(finished, args, option, allowed):
    """A count of 0 or less had listed everything (0) or all but N (-N), Python's slices; a port out of
    range had ended in a traceback from the socket's bind."""
    _, env, exp_id, _ = finished
    proc = cli(*[a.format(exp=exp_id) for a in args], env=env)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert f"Invalid value for {option}" in proc.stderr and f"is not in the range {allowed}" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("kind, target, why", [("csv", "missing/results.csv", "No such file or directory"),
                                               ("json", ".", "Is a directory")])
def test_an_export_to_a_file_it_cannot_write_says_so_in_a_line(finished, kind, target, why):
    tmp_path, env, exp_id, _ = finished
    path = tmp_path / target
    proc = cli("experiment", "export", exp_id, "-t", kind, "-f", str(path), env=env)
    assert proc.returncode == 1 and "Traceback" not in proc.stdout + proc.stderr
    assert proc.stdout.startswith(f"error: cannot write {path} ({why}): give --filename a file in a folder")
    assert not (tmp_path / "missing").exists()


def test_an_update_shows_once_as_the_value_in_force(finished):
    """`experiment show` and `config show` agree after `update`: the new values, each said once."""
    tmp_path, env, exp_id, _ = finished
    # a finished experiment whose trial budget is spent (a larger one would run it on): the value is for
    # its next run, and it says so
    for what, value in (("trialnum", "3"), ("concurrency", "3"), ("duration", "2h")):
        updated = cli("update", what, exp_id, value, env=env)
        assert updated.returncode == 0
        assert f"takes effect when the experiment runs again: trialflow resume {exp_id}" in updated.stdout
    space = tmp_path / "space.json"
    space.write_text('{"x": {"_type": "choice", "_value": [5]}}')
    assert cli("update", "searchspace", exp_id, "-f", str(space), env=env).returncode == 0
    shown = json.loads(cli("experiment", "show", exp_id, env=env).stdout)
    config = yaml.safe_load(cli("config", "show", exp_id, env=env).stdout)
    assert shown["params"] == config
    # the rest of NNI's experiment profile, as nnictl experiment show prints it, for scripts that read it
    assert (shown["id"], shown["status"], shown["logDir"]) == (exp_id, "DONE", str(tmp_path / "w" / exp_id))
    start, end = (_nnictl_time(shown[k]) for k in ("startTime", "endTime"))
    # the run time its run spent (what maxExperimentDuration counts), within its start and end
    assert start <= end and 0 <= shown["execDuration"] <= (end - start).total_seconds() + 1
    assert shown["nextSequenceId"] == 4  # the four trials run
    assert (config["maxTrialNumber"], config["trialConcurrency"], config["maxExperimentDuration"]) == (3, 3, 7200)
    assert config["searchSpace"] == {"x": {"_type": "choice", "_value": [5]}}
    assert not {"max_trial_number", "trial_concurrency", "max_experiment_duration", "search_space"} & set(
        shown["controls"])


def test_a_stop_of_an_ended_experiment_says_it_had_ended_and_gives_up_a_port_it_held(finished):
    """`stop` of a DONE experiment leaves it DONE and says so; one still on its port (here: held by this
    process, as a Python API kernel holds it after DONE) gives the port up, and `stop --port` finds it."""
    from trialflow.app.control import hold_web_port

    tmp_path, env, exp_id, _ = finished
    store = open_store(tmp_path / "w", exp_id)
    port = free_port()
    try:
        hold_web_port(store, port)
        by_port = cli("stop", "--port", str(port), env=env)
        assert by_port.returncode == 0 and by_port.stdout.strip() == (
            f"experiment {exp_id} had already ended DONE: port {port} is given up")
        again = cli("stop", exp_id, env=env)
        assert again.returncode == 0 and again.stdout.strip() == (
            f"experiment {exp_id} had already ended DONE: nothing to stop")
        assert store.experiment().status == "DONE"
    finally:
        store.close()


def test_stop_all_with_nothing_running_says_so(finished):
    _, env, _, _ = finished
    proc = cli("stop", "--all", env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "no experiment is running: nothing to stop"


def test_export_json_and_csv_and_trial_listing(finished):
    tmp_path, env, exp_id, _ = finished
    out = tmp_path / "export.json"
    assert cli("experiment", "export", exp_id, "-f", str(out), "-t", "json", "-i", env=env).returncode == 0
    rows = json.loads(out.read_text())
    assert len(rows) == 4
    for row in rows:
        # each result as its JSON text, as nnictl's export writes it
        assert json.loads(row["value"]) == row["parameter"]["x"] and row["intermediate"] == [row["value"]]
    out_csv = tmp_path / "export.csv"
    assert cli("experiment", "export", exp_id, "-f", str(out_csv), "-t", "csv", env=env).returncode == 0
    table = list(csv.DictReader(out_csv.open()))
    assert set(table[0]) == {"x", "reward", "trialJobId", "status"}
    head = cli("trial", "ls", exp_id, "--head", "1", env=env).stdout
    best = max(rows, key=lambda r: r["parameter"]["x"])["trialJobId"]  # no optimize_mode: NNI's rule, maximize
    assert best in head and sum(r["trialJobId"] in head for r in rows) == 1
    bad = cli("experiment", "export", exp_id, "-f", str(out), "-t", "xml", env=env)
    assert bad.returncode == 1 and "use json or csv" in bad.stdout


def test_trial_ls_json_prints_nnictls_trial_jobs(finished):
    """``--json``: what ``nnictl trial ls`` prints, NNI's REST trial jobs (parameters and results as the
    JSON text NNI's manager keeps, times as nnictl formats them), which NNI users' scripts read."""
    tmp_path, env, exp_id, _ = finished
    listed = cli("trial", "ls", exp_id, "--json", env=env)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    jobs = json.loads(listed.stdout)
    store = open_store(tmp_path / "w", exp_id)
    try:
        trials = store.trials()
    finally:
        store.close()
    assert [job["trialJobId"] for job in jobs] == [t.id for t in trials] and len(jobs) == 4
    for job, trial in zip(jobs, trials, strict=True):
        assert (job["status"], job["sequenceId"], job["logPath"]) == ("SUCCEEDED", trial.sequence, trial.log_dir)
        (parameters,) = [json.loads(p) for p in job["hyperParameters"]]
        assert parameters["parameters"] == trial.parameters and parameters["parameter_id"] == trial.parameter_id
        (final,) = job["finalMetricData"]
        assert final["type"] == "FINAL" and json.loads(json.loads(final["data"])) == trial.final  # as nnictl reads it
        start, end = (_nnictl_time(job[k]) for k in ("startTime", "endTime"))
        assert start <= end
    best = json.loads(cli("trial", "ls", exp_id, "--json", "--head", "1", env=env).stdout)
    assert [job["trialJobId"] for job in best] == [max(trials, key=lambda t: t.final).id]


def test_trial_kill_and_log_of_finished_trial(finished):
    tmp_path, env, exp_id, _ = finished
    out = tmp_path / "kill-export.json"
    cli("experiment", "export", exp_id, "-f", str(out), env=env)
    trial_id = json.loads(out.read_text())[0]["trialJobId"]
    proc = cli("trial", "kill", exp_id, trial_id, env=env)
    assert proc.returncode == 0 and "already ended (SUCCEEDED)" in proc.stdout
    assert cli("trial", "kill", exp_id, "nosuch", env=env).returncode == 1
    log = cli("log", "trial", exp_id, trial_id, env=env)
    assert log.returncode == 0 and "trial.stdout" in log.stdout
    listed = cli("log", "trial", exp_id, env=env)  # nnictl's `log trial` without a trial: every trial's logs
    store = open_store(tmp_path / "w", exp_id)
    assert listed.stdout.splitlines() == [f"{t.id}  {t.status:<13}  {t.log_dir}" for t in store.trials()]
    store.close()


def test_import_bad_file(finished):
    tmp_path, env, exp_id, _ = finished
    (tmp_path / "imp.json").write_text("{oops")
    proc = cli("experiment", "import", exp_id, "-f", str(tmp_path / "imp.json"), env=env)
    assert proc.returncode == 1 and "is not valid JSON" in proc.stdout
    (tmp_path / "imp.json").write_text(json.dumps([{"parameter": {"x": 0.5}, "value": "0.25"}]))
    proc = cli("experiment", "import", exp_id, "-f", str(tmp_path / "imp.json"), env=env)
    assert proc.returncode == 0 and "imported 1 result for the tuner" in proc.stdout


def _create_sleeping(tmp_path: Path, prefect_server: str, max_trials: int
                     ) -> tuple[dict[str, str], subprocess.CompletedProcess, str]:
    """``trialflow create`` in the background of an experiment whose trials sleep for two minutes."""
    env = {"PREFECT_API_URL": prefect_server, "TRIALFLOW_HOME": str(tmp_path / "home")}
    code = tmp_path / "code"
    write_trial(code, "import time, nni\nnni.get_next_parameter()\ntime.sleep(120)\n")
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(base_config(code, tmp_path / "w", maxTrialNumber=max_trials)))
    proc = cli("create", "--config", str(path), env=env)
    return env, proc, proc.stdout.split("experiment id:")[1].split()[0] if "experiment id:" in proc.stdout else ""


def test_background_create_then_stop(tmp_path, prefect_server):
    env, proc, exp_id = _create_sleeping(tmp_path, prefect_server, 10)
    assert proc.returncode == 0 and "started in the background" in proc.stdout
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        listing = cli("trial", "ls", exp_id, env=env).stdout
        if listing.count("RUNNING") >= 2:
            break
        time.sleep(1)
    assert listing.count("RUNNING") == 2
    stop = cli("stop", exp_id, env=env)
    assert stop.returncode == 0, stop.stdout
    view = cli("view", exp_id, env=env).stdout
    assert "STOPPED" in view and "USER_CANCELED 2" in view


def test_optuna_export_opens_as_a_study(finished):
    import optuna

    tmp_path, env, exp_id, _ = finished
    url = f"sqlite:///{tmp_path / 'study.db'}"
    proc = cli("experiment", "optuna", exp_id, "--storage", url, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    study = optuna.load_study(study_name=f"trialflow-{exp_id}", storage=url)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    measured = [t for t in done if t.intermediate_values]  # imported trials (test above) have none
    assert len(measured) == 4 and all(t.value == t.params["x"] for t in measured)
    assert all(t.intermediate_values == {0: t.params["x"]} for t in measured)


def test_trial_ls_of_an_experiment_with_no_trial_yet_says_so(tmp_path):
    """Between ``create`` and its first submission (a work pool's worker can hold it a minute) the
    listing says there are none yet, not a traceback (seen by hand)."""
    from trialflow import parse_config
    from trialflow.experiments import create_experiment

    exp_id, _ = create_experiment(parse_config(base_config(tmp_path, tmp_path / "w", maxTrialNumber=3)))
    proc = cli("trial", "ls", exp_id, "--root", str(tmp_path / "w"))
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "no trials yet\n", "")


def test_trial_ls_of_thousands_of_trials_lists_every_one_quickly(tmp_path):
    from trialflow import parse_config
    from trialflow.experiments import create_experiment, open_store

    exp_id, exp_dir = create_experiment(parse_config(base_config(tmp_path, tmp_path / "w", maxTrialNumber=3000)))
    store = open_store(exp_dir.parent, exp_id)
    ids = [f"T{i:05d}" for i in range(3000)]
    for i, trial_id in enumerate(ids):
        store.add_trial(trial_id, None, i, {"x": i / 3000}, {"x": i / 3000})
        store.set_status(trial_id, "RUNNING")
        store.set_status(trial_id, "SUCCEEDED" if i % 3 else "FAILED", 0 if i % 3 else 1)
    proc = cli("trial", "ls", exp_id, "--root", str(tmp_path / "w"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 3001 and lines[0].split()[:3] == ["trial", "#", "status"]
    assert [line.split()[0] for line in lines[1:]] == ids
    assert lines[2].split()[2] == "SUCCEEDED" and lines[1].split()[2] == "FAILED"


def test_config_convert_prints_the_v2_equivalent_of_an_nni_v1_file(tmp_path):
    from tests.test_config import V1
    from trialflow import load_config

    (tmp_path / "search_space.json").write_text('{"lr": {"_type": "uniform", "_value": [0.1, 1]}}')
    v1 = tmp_path / "config.yml"
    v1.write_text(V1.format(platform="remote") + "machineList:\n  - ip: 10.0.0.5\n    port: 2200\n"
                  "    username: bob\n    passwd: '12345'\n")
    proc = cli("config", "convert", str(v1))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    v2 = yaml.safe_load(proc.stdout)
    assert v2["trainingService"]["platform"] == "remote" and v2["trialCommand"] == "python3 mnist.py"
    assert v2["trainingService"]["machineList"][0] == {"host": "10.0.0.5", "port": 2200, "user": "bob",
                                                       "password": "12345"}
    assert v2["searchSpaceFile"] == "search_space.json" and v2["tuner"]["name"] == "TPE"
    out = tmp_path / "config_v2.yml"
    assert cli("config", "convert", str(v1), "-o", str(out)).returncode == 0
    with pytest.warns(UserWarning, match="legacy v1"):
        original = load_config(v1)
    assert load_config(out).dump() == original.dump()  # the same experiment, now without the notice
    again = cli("config", "convert", str(out))
    assert again.returncode == 1 and "already a v2 config" in again.stdout + again.stderr
    (tmp_path / "bad.yml").write_text(V1.format(platform="nope"))
    bad = cli("config", "convert", str(tmp_path / "bad.yml"))
    assert bad.returncode == 1 and "nope" in bad.stdout + bad.stderr


def test_the_python_api_updates_kills_and_stops_an_experiment_whose_controller_was_killed(tmp_path, prefect_server):
    import signal

    import trialflow
    from trialflow.experiments import open_store
    from trialflow.trial.procs import pid_alive, read_json

    _, _, exp_id = _create_sleeping(tmp_path, prefect_server, 2)
    store = open_store(tmp_path / "w", exp_id)
    deadline = time.monotonic() + 120
    while len(store.trials(["RUNNING"])) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    first, second = (t.id for t in store.trials(["RUNNING"]))
    assert trialflow.kill_trial(exp_id, first, root=tmp_path / "w").status in ("RUNNING", "USER_CANCELED")
    while store.trial(first).status != "USER_CANCELED" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert store.trial(first).status == "USER_CANCELED"  # the live controller cancelled it
    assert trialflow.update_experiment(exp_id, "duration", "2h", root=tmp_path / "w") == 7200
    assert store.controls()["max_experiment_duration"] == 7200
    with pytest.raises(trialflow.UserError, match="bad concurrency value 0: must be from 1 to 1000"):
        trialflow.update_experiment(exp_id, "concurrency", 0, root=tmp_path / "w")
    with pytest.raises(trialflow.UserError, match=f"experiment {exp_id} is running; stop it first"):
        trialflow.delete_experiment(exp_id, root=tmp_path / "w")
    assert (tmp_path / "w" / exp_id / "trials" / first).is_dir()  # refused: nothing deleted
    os.kill(int(store.experiment().controller_pid), signal.SIGKILL)
    keeper = read_json(str(tmp_path / "w" / exp_id / "trials" / second / ".nni" / "keeper.pid"))
    result = trialflow.stop_experiment(exp_id, root=tmp_path / "w", wait=5)
    assert result.status == "STOPPED"
    assert {t.id: t.status for t in result.trials} == {first: "USER_CANCELED", second: "USER_CANCELED"}
    assert keeper is not None and not pid_alive(int(keeper["pid"]), keeper.get("start_time"))  # stopped here
    with pytest.raises(KeyError):
        trialflow.kill_trial(exp_id, "nosuchtrial", root=tmp_path / "w")
    store.close()


@pytest.mark.usefixtures("prefect_server")  # runs an experiment: e2e, on the session's server
def test_the_python_api_deletes_a_finished_experiment_and_forgets_its_config(tmp_path):
    import trialflow
    from trialflow.experiments import LIVE_CONFIGS

    code = tmp_path / "code"
    write_trial(code, "import nni\nnni.get_next_parameter()\nnni.report_final_result(1)\n")
    result = trialflow.run_experiment(base_config(code, tmp_path / "w", maxTrialNumber=1))
    exp_id = result.experiment_id
    assert result.status == "DONE" and exp_id in LIVE_CONFIGS  # kept after the run: it holds the secrets
    assert trialflow.delete_experiment(exp_id, root=str(tmp_path / "w")) == tmp_path / "w" / exp_id  # text too
    assert not (tmp_path / "w" / exp_id).exists() and exp_id not in LIVE_CONFIGS
    with pytest.raises(trialflow.UserError, match=f"no experiment '{exp_id}'"):
        trialflow.delete_experiment(exp_id, root=tmp_path / "w")


def test_a_foreground_run_without_a_terminal_names_its_ui_page_while_it_runs(tmp_path, prefect_server):
    """cron and CI logs: no live table to watch, so the run's page is printed as soon as it is known."""
    from tests.conftest import wait_for

    hold = tmp_path / "hold"
    hold.touch()
    code = tmp_path / "code"
    write_trial(code, f"import os, time, nni\nnni.get_next_parameter()\nwhile os.path.exists({str(hold)!r}):\n"
                      "    time.sleep(0.1)\nnni.report_final_result(1)\n")
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(base_config(code, tmp_path / "w", maxTrialNumber=1)))
    log = tmp_path / "cron.log"
    with open(log, "wb") as out:  # a file, as cron and CI keep it: not a terminal
        proc = subprocess.Popen([sys.executable, "-m", "trialflow.cli", "create", "--config", str(path),
                                 "--foreground"], stdout=out, stderr=subprocess.STDOUT, env=os.environ.copy())
    try:
        line = wait_for(lambda: next((x for x in log.read_text().splitlines() if "Prefect UI: " in x), None),
                        timeout=120)
        assert proc.poll() is None  # while it runs
        assert f"Prefect UI: {prefect_server[:-4]}" in line and "/runs/flow-run/" in line
    finally:
        hold.unlink()
        assert proc.wait(timeout=120) == 0


def test_trial_ls_fits_an_80_column_terminal(tmp_path, prefect_server):
    """One line per trial at 80 columns: id, status, the whole metric, duration, then the parameters
    (cut) or why it ended."""
    import trialflow

    code = tmp_path / "code"
    write_trial(code, "import sys, nni\np = nni.get_next_parameter()\nif p['learning_rate'] > 0.05:\n"
                      "    sys.exit(3)\nnni.report_final_result(0.9123456 - p['learning_rate'])\n")
    space = {"learning_rate": {"_type": "choice", "_value": [0.001, 0.1]},
             "optimizer_name": {"_type": "choice", "_value": ["adam_with_weight_decay"]},
             "hidden_layer_sizes": {"_type": "choice", "_value": [[512, 256, 128, 64]]}}
    result = trialflow.run_experiment(base_config(code, tmp_path / "w", searchSpace=space, maxTrialNumber=2,
                                                  tuner={"name": "GridSearch"}))
    proc = cli("trial", "ls", result.experiment_id, "--root", str(tmp_path / "w"), env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    rows = {t.id: next(line for line in lines if line.strip().startswith(t.id)) for t in result.trials}
    assert len([line for line in lines if any(line.strip().startswith(t.id) for t in result.trials)]) == 2
    ok, failed = sorted(result.trials, key=lambda t: t.status != "SUCCEEDED")
    assert "SUCCEEDED" in rows[ok.id] and "0.911346" in rows[ok.id] and "learning_rate=0.001" in rows[ok.id]
    assert rows[ok.id].rstrip().endswith("…")  # the rest of its parameters is cut, not wrapped
    assert "FAILED" in rows[failed.id] and "exit code 3" in rows[failed.id]


def test_the_read_only_commands_load_no_numerical_library_nor_the_config_models(tmp_path):
    """``trial ls``, ``experiment list`` and ``export`` read records only: what they import leaves out
    the tuners' numerical libraries, Optuna, Prefect, trialflow's config models, pydantic (which typer
    0.29 would load for its option values), PyYAML and SQLAlchemy (an embedded store is read with
    ``sqlite3``): together about half a second of every such command's start (benchmarks/listings.py)."""
    from trialflow.records.store_records import DB_RELATIVE_PATH

    db = tmp_path / "w" / "embedded1" / DB_RELATIVE_PATH  # an experiment of five trials, at this code's schema
    db.parent.mkdir(parents=True)
    db.write_bytes((Path(__file__).parent / "assets" / "stores" / "v3" / "trialflow.sqlite").read_bytes())
    code = ("import sys\n"
            "from trialflow.cli import main\n"
            "sys.argv = ['trialflow', *sys.argv[1:]]\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "heavy = ('numpy', 'optuna', 'prefect', 'trialflow.config', 'trialflow.assessors', 'pydantic', 'yaml',\n"
            "         'sqlalchemy')\n"
            "print('LOADED', sorted(m for m in heavy if m in sys.modules))\n")
    home = tmp_path / "home"
    env = {**os.environ, "HOME": str(home), "TRIALFLOW_HOME": str(tmp_path / "w")}
    root = ["--root", str(tmp_path / "w")]
    for args, shown in ((["experiment", "list", "--all"], "embedded1"),
                        (["trial", "ls", "embedded1", *root], "EARLY_STOPPED"),
                        (["experiment", "export", "embedded1", *root, "-f", str(tmp_path / "x.csv")],
                         "exported 5 trials")):
        done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                              timeout=60)
        assert "LOADED []" in done.stdout and shown in done.stdout, (args, done.stdout, done.stderr)


def test_a_create_that_checks_its_config_loads_no_numerical_library(tmp_path):
    """``create`` checks the whole config (here TPE and Curvefitting with their arguments) before its
    experiment exists; that check loads neither numpy nor Optuna, whose imports would only delay every
    command that runs an experiment."""
    (tmp_path / "code").mkdir()
    config = tmp_path / "config.yml"
    config.write_text(yaml.safe_dump({
        "searchSpace": {"x": {"_type": "uniform", "_value": [0, 1]}}, "trialCommand": "python3 trial.py",
        "trialCodeDirectory": str(tmp_path / "code"), "trialConcurrency": 2, "maxTrialNumber": -4,
        "tuner": {"name": "TPE", "classArgs": {"optimize_mode": "maximize"}},
        "assessor": {"name": "Curvefitting", "classArgs": {"epoch_num": 20}},
        "trainingService": {"platform": "local"}}))
    code = ("import sys\n"
            "from trialflow.cli import main\n"
            "sys.argv = ['trialflow', *sys.argv[1:]]\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print('LOADED', sorted(m for m in ('numpy', 'optuna', 'scipy') if m in sys.modules))\n")
    env = {**os.environ, "HOME": str(tmp_path / "home"), "TRIALFLOW_HOME": str(tmp_path / "w")}
    done = subprocess.run([sys.executable, "-c", code, "create", "--config", str(config)], capture_output=True,
                          text=True, env=env, timeout=60)
    assert "maxTrialNumber" in done.stderr + done.stdout, (done.stdout, done.stderr)
    assert "LOADED []" in done.stdout, (done.stdout, done.stderr)


def test_trialflow_s_warnings_during_a_live_table_print_above_it_and_nothing_goes_straight_to_the_terminal(tmp_path):
    """A warning logged while the live table is up (the API gone: "the cancel check: a call to the
    Prefect API failed") is printed by the table's console, above the table; written straight to the
    terminal by Prefect's console handler, it landed after the table, whose next redraw erased it and
    left the table's first lines behind. Prefect's chatter stays off, and the handlers are as they were
    after the table."""
    code = ("import io, logging\n"
            "from prefect.logging.configuration import setup_logging\n"
            "setup_logging()\n"
            "from rich.console import Console\n"
            "from rich.live import Live\n"
            "from trialflow.presentation.live import keep_prefect_chatter_off_the_terminal, logs_above_the_table\n"
            "keep_prefect_chatter_off_the_terminal()\n"
            "screen = io.StringIO()\n"
            "console = Console(file=screen, force_terminal=True, width=200)\n"
            "with Live('THE TABLE', console=console, auto_refresh=False) as live, logs_above_the_table(console):\n"
            "    logging.getLogger('trialflow.experiment').warning('the cancel check: a call failed')\n"
            "    logging.getLogger('prefect._internal.concurrency').error(\"Service 'EventsWorker' failed\")\n"
            "    logging.getLogger('prefect._internal.concurrency').critical('critical stays')\n"
            "    live.refresh()\n"
            "logging.getLogger('trialflow.experiment').warning('after the table')\n"
            "print(repr(screen.getvalue()))\n")
    env = {**os.environ, "HOME": str(tmp_path), "PREFECT_HOME": str(tmp_path / "prefect")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    screen = done.stdout
    # through the table's console, before the table's last drawing
    assert "WARNING | trialflow.experiment - the cancel check: a call failed" in screen, (screen, done.stderr)
    assert screen.index("the cancel check") < screen.rindex("THE TABLE") and "critical stays" in screen, screen
    assert "EventsWorker" not in screen + done.stderr, (screen, done.stderr)
    # nothing straight to the terminal while the table was up; the handlers print again after it
    assert done.stderr.splitlines() == [line for line in done.stderr.splitlines() if "after the table" in line]
    assert "after the table" in done.stderr and "after the table" not in screen, (screen, done.stderr)


def test_a_foreground_run_keeps_prefect_s_outage_chatter_off_the_terminal(tmp_path):
    """When the Prefect API goes away mid-run (``trialflow server stop --force`` from another shell),
    Prefect's events worker logs an error with the whole event for each one it could not send, on
    ``prefect._internal``, which has a stderr handler of its own and does not pass records to the root;
    its log shipper writes "--- Error logging to API ---" to stderr for each batch. A foreground run's
    terminal shows trialflow's warnings and anything critical only, whichever logger holds the handler."""
    code = ("import datetime, logging, uuid\n"
            "from prefect.logging.configuration import setup_logging\n"
            "setup_logging()\n"
            "from trialflow.presentation.live import keep_prefect_chatter_off_the_terminal\n"
            "keep_prefect_chatter_off_the_terminal()\n"
            "logging.getLogger('prefect._internal.concurrency').error(\"Service 'EventsWorker' failed\")\n"
            "logging.getLogger('prefect.flow_runs').error('a failed trial task')\n"
            "logging.getLogger('trialflow.flows').warning('the Prefect API does not answer')\n"
            "logging.getLogger('prefect._internal.concurrency').critical('critical stays')\n"
            # Prefect's log shipper, sending a run's log line to an API nobody serves
            "from prefect.logging.handlers import APILogWorker\n"
            "APILogWorker.instance().send({'name': 'prefect.flow_runs', 'level': 20, 'message': 'a line',\n"
            "    'timestamp': datetime.datetime.now(datetime.timezone.utc).isoformat(),\n"
            "    'flow_run_id': str(uuid.uuid4()), 'task_run_id': None})\n"
            "APILogWorker.drain_all(timeout=30)\n"
            "print('drained')\n")
    env = {**os.environ, "HOME": str(tmp_path), "PREFECT_HOME": str(tmp_path / "prefect"),
           "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore", "PREFECT_CLIENT_MAX_RETRIES": "0",
           "PREFECT_API_URL": f"http://127.0.0.1:{free_port()}/api"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    shown = done.stdout + done.stderr
    assert "drained" in shown and "the Prefect API does not answer" in shown and "critical stays" in shown, shown
    assert "EventsWorker" not in shown and "a failed trial task" not in shown, shown
    assert "Error logging to API" not in shown and "connection attempts failed" not in shown, shown


def test_a_crafted_experiment_name_stays_on_its_experiments_line_of_the_nnictl_listing():
    """A name with a line break (an imported experiment's, say) cannot add a line that reads as another
    experiment's to a script that reads `experiment list`."""
    from trialflow.experiments.trial_jobs import nnictl_list_line
    from trialflow.records.store_records import ExperimentRecord

    record = ExperimentRecord(id="abcd1234", name="x\nId: other999    Status: RUNNING\x1b[2J", config={},
                              config_path=None, status="DONE", message=None, start_time=0.0, end_time=None,
                              controller_pid=None, next_sequence=0)
    line = nnictl_list_line(record, None, "local", 3, Path("/w/abcd1234"))
    assert line.count("\n") == 1 and line.endswith("\n") and "\x1b" not in line
    assert line.startswith("Id: abcd1234    Name: x\\nId: other999    Status: RUNNING\\x1b[2J    Status: DONE    ")
