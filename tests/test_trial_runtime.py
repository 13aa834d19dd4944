"""Trial runtime and record format: NNI-compatible framing, bad input, standalone mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import base_config, process_state, stop_process, write_trial
from trialflow.trial import NNI_SHIM_DIR, RUNTIME_ROOT
from trialflow.trial.records import (
    MAX_RECORD_BYTES,
    MetricRecord,
    MetricRecordError,
    encode_file_record,
    encode_stdout_line,
    parse_file_frames,
    parse_record,
    parse_stdout_lines,
)


def test_file_framing_is_byte_compatible_with_nni():
    rec = MetricRecord("abcde", "PERIODICAL", 0, {"default": 0.1, "loss": 1.0}, 7)
    frame = encode_file_record(rec)
    payload = frame[8:]
    assert frame[:2] == b"ME" and int(frame[2:8]) == len(payload) and payload.endswith(b"\n")
    data = json.loads(payload)
    assert data["trial_job_id"] == "abcde" and json.loads(data["value"]) == {"default": 0.1, "loss": 1.0}


def test_nni_sdk_written_record_is_read():
    # the first record NNI 3.0's own SDK wrote in the reference run
    payload = (b'{"parameter_id": 7, "trial_job_id": "abcde", "type": "PERIODICAL", "sequence": 0, '
               b'"value": "{\\"default\\": 0.1, \\"loss\\": 1.0}"}\n')
    frame = b"ME" + b"%06d" % len(payload) + payload
    result = parse_file_frames(frame, 0, "abcde")
    assert result.records[0].value == {"default": 0.1, "loss": 1.0} and result.offset == len(frame)


def test_partial_frames_wait_and_garbage_is_skipped():
    a = encode_file_record(MetricRecord("t", "PERIODICAL", 0, 1))
    b = encode_file_record(MetricRecord("t", "PERIODICAL", 1, 2))
    first = parse_file_frames(a + b[:10], 0, "t")
    assert [r.value for r in first.records] == [1] and first.offset == len(a)
    rest = parse_file_frames(b"garbage!!" + b, 0, "t")
    assert [r.value for r in rest.records] == [2] and rest.errors and "garbage" in rest.errors[0]


@pytest.mark.parametrize("payload,message", [
    (b"not json", "not valid JSON"),
    (b"[1, 2]", "must be a JSON object"),
    (b'{"type": "OTHER", "trial_job_id": "t", "value": "1"}', "PERIODICAL or FINAL"),
    (b'{"type": "FINAL", "trial_job_id": "u", "value": "1"}', "belongs to trial 'u'"),
    (b'{"type": "FINAL", "trial_job_id": "t", "sequence": -1, "value": "1"}', "non-negative"),
])
def test_bad_records_are_rejected_with_a_reason(payload, message):
    with pytest.raises(MetricRecordError, match=message):
        parse_record(payload, "t")


def test_oversized_and_deeply_nested_records():
    with pytest.raises(MetricRecordError, match="limit"):
        encode_file_record(MetricRecord("t", "FINAL", 0, "x" * MAX_RECORD_BYTES))
    deep: object = 1
    for _ in range(40):
        deep = [deep]
    with pytest.raises(MetricRecordError, match="nested"):
        parse_record(MetricRecord("t", "FINAL", 0, deep).to_json(), "t")


def test_stdout_marker_lines_among_output():
    good = encode_stdout_line(MetricRecord("t", "FINAL", 0, 0.5))
    data = f"hello\n{good}\nNNISDK_MEb'{{broken\nlast partial".encode()
    result = parse_stdout_lines(data, 0, "t")
    assert [r.value for r in result.records] == [0.5]
    assert result.errors and result.offset == data.rindex(b"\n") + 1
    huge = parse_stdout_lines(b"x" * 5000, 0, "t", max_line=1000)
    assert huge.offset == 5000 and "over 1000 bytes" in huge.errors[0]


def _run_standalone(script: str, tmp_path, python: str = sys.executable):
    """``python script.py`` in a shell with trialflow installed and nothing else set (as a user debugs a trial)."""
    path = tmp_path / "standalone.py"
    path.write_text(script)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NNI_") and k != "PYTHONPATH"}
    return subprocess.run([python, str(path)], capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path)


def test_standalone_trial_prints_results_and_exits_zero(tmp_path):
    proc = _run_standalone("import nni\np = nni.get_next_parameter()\nprint('params', p)\n"
                           "nni.report_intermediate_result(0.5)\nnni.report_final_result(0.9)\n"
                           "print(nni.get_trial_id(), nni.get_experiment_id(), nni.get_sequence_id())\n", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "params {}" in proc.stdout
    assert "Intermediate result: 0.5  (Index 0)" in proc.stdout and "Final result: 0.9" in proc.stdout
    assert "STANDALONE STANDALONE 0" in proc.stdout
    assert "without runtime" in proc.stderr


def test_an_installed_nni_is_imported_before_trialflows_compatibility_package(tmp_path):
    # a virtual environment that sees this installation's packages and has an NNI of its own, found first
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True,
                   timeout=120)
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    (Path(site) / "nni").mkdir(parents=True)
    (Path(site) / "nni" / "__init__.py").write_text("def get_next_parameter():\n    return {'from': 'nni'}\n")
    proc = _run_standalone("import nni\nprint('params', nni.get_next_parameter())\n", tmp_path, python)
    assert proc.returncode == 0, proc.stderr
    assert "params {'from': 'nni'}" in proc.stdout


def test_reporting_before_getting_parameters_is_refused_inside_an_experiment(tmp_path):
    path = tmp_path / "t.py"
    path.write_text("import nni\nnni.report_final_result(1)\n")
    env = {**os.environ, "NNI_PLATFORM": "local", "NNI_SYS_DIR": str(tmp_path),
           "PYTHONPATH": os.pathsep.join([NNI_SHIM_DIR, RUNTIME_ROOT])}
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode != 0 and "get_next_parameter() needs to be called before" in proc.stderr


def test_a_run_after_an_interruption_numbers_its_results_on_and_finds_its_checkpoint_folder(tmp_path):
    """What the platform tells a later run (its attempt, the results stored before it) reaches the
    trial's API: intermediate results go on from the stored count, the final one is the run's own,
    and the checkpoint folder is the trial directory's ``checkpoint/`` unless the platform names one."""
    from trialflow.platforms.trialdir import read_metrics_file
    from trialflow.trial.protocol import PARAMETER_FILE

    (tmp_path / ".nni").mkdir()
    (tmp_path / PARAMETER_FILE).write_text(json.dumps({"parameter_id": 0, "parameters": {"x": 1}}))
    (tmp_path / "t.py").write_text(
        "import nni, os\nfrom trialflow.trial import get_attempt, get_checkpoint_dir\n"
        "nni.get_next_parameter()\nnni.report_intermediate_result(get_attempt())\n"
        "nni.report_intermediate_result(os.path.isdir(get_checkpoint_dir()))\nnni.report_final_result(get_checkpoint_dir())\n")
    env = {**os.environ, "NNI_PLATFORM": "local", "NNI_SYS_DIR": str(tmp_path), "NNI_TRIAL_JOB_ID": "Intr1",
           "TRIALFLOW_METRIC_CHANNEL": "file", "TRIALFLOW_ATTEMPT": "2", "TRIALFLOW_INTERMEDIATE_REPORTED": "3",
           "PYTHONPATH": os.pathsep.join([NNI_SHIM_DIR, RUNTIME_ROOT])}
    env.pop("TRIALFLOW_CHECKPOINT_DIR", None)
    proc = subprocess.run([sys.executable, "t.py"], capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    records = read_metrics_file(tmp_path, 0, "Intr1")[0]
    assert [(r.type, r.sequence, r.value) for r in records] == [
        ("PERIODICAL", 3, 2), ("PERIODICAL", 4, True), ("FINAL", 0, str(tmp_path / "checkpoint"))]


@pytest.mark.usefixtures("prefect_server")
def test_unchanged_nni_trial_code_metrics_arrive_in_order(tmp_path):
    from trialflow import run_experiment
    from trialflow.experiments import open_store

    code = tmp_path / "code"
    write_trial(code, """
import nni
params = nni.get_next_parameter()
for epoch in range(6):
    nni.report_intermediate_result({"default": params["x"] + epoch, "epoch": epoch})
nni.report_final_result({"default": params["x"], "trial": nni.get_trial_id(), "seq": nni.get_sequence_id()})
""")
    result = run_experiment(base_config(code, tmp_path / "w", maxTrialNumber=3))
    store = open_store(tmp_path / "w", result.experiment_id)
    for t in result.trials:
        inter = store.metrics(t.id, "PERIODICAL")
        assert [m.value["epoch"] for m in inter] == list(range(6))
        assert [m.value["default"] for m in inter] == [t.parameters["x"] + e for e in range(6)]
        assert t.final == {"default": t.parameters["x"], "trial": t.id, "seq": t.sequence}


KILLED_WHILE_DETACHING = """
import os, signal, sys
import trialflow.trial.keeper as keeper
keeper.daemonize = lambda log: os.kill(os.getpid(), signal.SIGKILL)  # the SSH session dies right here
keeper.main(["--submit"])
"""


def test_a_submission_killed_while_detaching_can_be_submitted_again(tmp_path):
    import time

    trial_dir = tmp_path / "trial"
    payload = json.dumps({"trial_dir": str(trial_dir), "parameter": "{}",
                          "keeper": {"command": f"{sys.executable} -c 'print(42)'", "cwd": str(tmp_path), "env": {}}})
    env = {**os.environ, "PYTHONPATH": RUNTIME_ROOT}
    first = subprocess.run([sys.executable, "-c", KILLED_WHILE_DETACHING], input=payload, text=True, env=env)
    assert first.returncode == -9 and (trial_dir / ".nni" / "keeper.json").is_file()
    again = subprocess.run([sys.executable, "-S", "-m", "trialflow.trial.keeper", "--submit"], input=payload,
                           text=True, env=env, timeout=30)
    assert again.returncode == 0
    state = trial_dir / ".nni" / "state"
    deadline = time.monotonic() + 20
    while not state.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert json.loads(state.read_text())["exit_code"] == 0  # it ran, instead of waiting forever
    assert (trial_dir / "trial.stdout").read_text().strip() == "42"


SAVES_ON_SIGINT = """
import os, signal, sys, time
signal.signal(signal.SIGINT, lambda *_: sys.exit(1))  # saves its work and exits 1 on Ctrl-C
open("ready", "w").close()
deadline = time.monotonic() + float(sys.argv[1])
while time.monotonic() < deadline and not os.path.exists("go"):  # ends by itself when the test says so
    time.sleep(0.01)
sys.exit(3)
"""


def _took_signal_and_waits(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has taken signal ``signum`` (no longer pending) and waits for its child
    again: a Python process runs its handlers before it retries an interrupted wait."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    pending = [int(line.split()[1], 16) for line in status if line.startswith(("SigPnd:", "ShdPnd:"))]
    where = Path(f"/proc/{pid}/wchan").read_text()  # "0" where the kernel does not say
    return (not any(mask & (1 << (signum - 1)) for mask in pending) and process_state(pid) == "S"
            and where in ("do_wait", "0"))


@pytest.mark.parametrize("signalled", ["while-it-runs", "after-it-exited", "by-trialflow-keeper-late",
                                       "by-a-marked-platform-stop-keeper-late"])
def test_a_stop_signal_counts_only_when_it_reached_the_running_trial(tmp_path, signalled):
    """A stop signal that reaches the trial's group while the trial runs makes its exit the stop's
    (``stop_signal`` in its state); one that arrives after the trial exited by itself, before the keeper
    saw that exit (a busy machine), leaves the trial its own exit code. Each case holds one process
    stopped so the order is the one it names: the keeper across the trial's exit, or the trial until
    the keeper has taken the signal (on a loaded machine the trial may otherwise answer first: see
    the keeper's module docstring). trialflow's own kill counts even when the trial answers it before
    the keeper takes the signal (the keeper stopped across the trial's exit); so does a platform's stop
    that signals the keeper and the trial at once (Slurm's ``scancel``) after ``keeper --mark-stop``."""
    import signal
    import threading
    import time

    from trialflow.trial.keeper import claim, kill_trial, write_trial_files

    (tmp_path / "trial.py").write_text(SAVES_ON_SIGINT)
    trial_dir = Path(write_trial_files({"trial_dir": str(tmp_path / "t"), "parameter": "{}", "keeper": {
        "command": f"exec {sys.executable} -S trial.py 30", "cwd": str(tmp_path), "env": {}}}))
    assert claim(str(trial_dir))  # as a detached keeper does: the kill then stops it instead of its start
    keeper = subprocess.Popen([sys.executable, "-S", "-m", "trialflow.trial.keeper", str(trial_dir)],
                              env={**os.environ, "PYTHONPATH": RUNTIME_ROOT}, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        started = trial_dir / ".nni" / "started"  # the keeper writes it once its trial runs: maybe after "ready"
        while not ((tmp_path / "ready").exists() and started.exists()) and time.monotonic() < deadline:
            time.sleep(0.02)
        trial_pid = json.loads(started.read_text())["pid"]
        if signalled == "by-trialflow-keeper-late":
            stop_process(keeper.pid)
            killer = threading.Thread(target=kill_trial, args=(str(trial_dir), 20.0), daemon=True)
            killer.start()
            while process_state(trial_pid) != "Z" and time.monotonic() < deadline:  # it answered the SIGINT
                time.sleep(0.02)
            os.kill(keeper.pid, signal.SIGCONT)
            assert keeper.wait(timeout=30) == 0
            killer.join(timeout=30)
        elif signalled == "by-a-marked-platform-stop-keeper-late":
            marked = subprocess.run([sys.executable, "-S", "-m", "trialflow.trial.keeper", "--mark-stop",
                                     str(trial_dir)], env={**os.environ, "PYTHONPATH": RUNTIME_ROOT}, timeout=30)
            assert marked.returncode == 0 and (trial_dir / ".nni" / "stop_sent").exists()
            stop_process(keeper.pid)  # the platform's signal reaches the trial first
            os.kill(trial_pid, signal.SIGINT)
            while process_state(trial_pid) != "Z" and time.monotonic() < deadline:  # it answered
                time.sleep(0.02)
        elif signalled == "after-it-exited":
            stop_process(keeper.pid)  # the keeper, descheduled, has not seen the exit yet
            (tmp_path / "go").touch()  # the trial ends by itself only now: the keeper cannot have reaped it
            while process_state(trial_pid) != "Z" and time.monotonic() < deadline:
                time.sleep(0.02)
        else:
            stop_process(trial_pid)  # the trial answers only once the keeper has seen the signal
        if signalled != "by-trialflow-keeper-late":
            os.killpg(keeper.pid, signal.SIGINT)
            os.kill(keeper.pid, signal.SIGCONT)
        if signalled == "while-it-runs":
            while not _took_signal_and_waits(keeper.pid, signal.SIGINT) and time.monotonic() < deadline:
                time.sleep(0.01)
            os.kill(trial_pid, signal.SIGCONT)
        assert keeper.wait(timeout=30) == 0
    finally:
        if keeper.poll() is None:
            os.killpg(keeper.pid, signal.SIGKILL)
    state = json.loads((trial_dir / ".nni" / "state").read_text())
    if signalled != "after-it-exited":
        assert (state["exit_code"], state.get("stop_signal")) == (1, True)
    else:
        assert (state["exit_code"], state.get("stop_signal")) == (3, None)


@pytest.mark.parametrize("files", [(), ("started", "state"), ("state",)], ids=["not-started", "ended", "never-started"])
def test_a_stop_mark_is_left_only_for_a_trial_whose_files_say_it_runs(tmp_path, files):
    """``keeper --mark-stop`` before a platform's stop marks nothing for a trial that has not started or
    has ended: a later run's own exit, or a recorded end, is not taken for that stop's."""
    from trialflow.trial.keeper import mark_stop
    from trialflow.trial.protocol import META_DIR, STOP_SENT

    meta = tmp_path / "t" / META_DIR
    meta.mkdir(parents=True)
    for name in files:
        (meta / name).write_text("{}")
    assert mark_stop(str(tmp_path / "t")) is False and not (meta / STOP_SENT).exists()
    (meta / "state").unlink(missing_ok=True)
    (meta / "started").write_text("{}")
    assert mark_stop(str(tmp_path / "t")) is True and (meta / STOP_SENT).exists()


@pytest.mark.parametrize("taken_over", ["meta moved aside", "meta made again, spec not yet written",
                                        "spec of the next run"])
def test_a_restarted_replica_of_an_earlier_run_claims_nothing_while_a_later_run_takes_the_trial_over(
        tmp_path, capsys, taken_over):
    """A cluster restarts run 0's job while run 1 is being written into the trial directory (its
    ``.nni`` moved aside, made again, its spec written last): run 0's replica runs nothing and leaves
    no claim, so run 1's replica is the one to claim and run the trial (an Azure ML job restarted
    after its preemption once claimed run 1's empty directory and failed it)."""
    from trialflow.platforms.trialdir import LOCAL, set_aside_earlier_run
    from trialflow.trial.keeper import pod
    from trialflow.trial.procs import write_atomic
    from trialflow.trial.protocol import KEEPER_LOCK, KEEPER_SPEC, META_DIR

    trial = tmp_path / "trials" / "Taken1"
    (trial / META_DIR).mkdir(parents=True)
    write_atomic(str(trial / META_DIR / KEEPER_SPEC), json.dumps({"command": "touch ran", "attempt": 0,
                                                                  "sole_primary": True}))
    (trial / META_DIR / KEEPER_LOCK).write_text("run0-pod")  # run 0's replica ran the trial
    set_aside_earlier_run(LOCAL, str(trial), 1)
    if taken_over != "meta moved aside":
        (trial / META_DIR).mkdir()
    if taken_over == "spec of the next run":
        write_atomic(str(trial / META_DIR / KEEPER_SPEC), json.dumps({"command": "touch ran", "attempt": 1,
                                                                      "sole_primary": True}))
    assert pod(str(trial), "worker", "worker", 0) == 0
    assert "took over from run 0; this replica runs nothing" in capsys.readouterr().err
    assert not (trial / META_DIR / KEEPER_LOCK).exists() and not (trial / "ran").exists()
    assert (trial / f"{META_DIR}-0" / KEEPER_LOCK).read_text() == "run0-pod"  # the earlier run's record stays


def test_a_batch_job_runs_its_trial_once_and_a_job_of_an_earlier_run_nothing(tmp_path, capsys):
    """Slurm's batch job: the first run of the job claims and runs the trial; the same job run again by
    the scheduler (a requeue) runs nothing; a job of run 0 whose trial run 1 took over runs nothing."""
    from trialflow.platforms.trialdir import LOCAL, set_aside_earlier_run
    from trialflow.trial.keeper import batch
    from trialflow.trial.procs import write_atomic
    from trialflow.trial.protocol import KEEPER_LOCK, KEEPER_SPEC, META_DIR, STATE

    trial = tmp_path / "trials" / "Batch1"
    (trial / META_DIR).mkdir(parents=True)
    write_atomic(str(trial / META_DIR / KEEPER_SPEC), json.dumps({"command": "echo x >> ran", "cwd": str(trial),
                                                                  "env": {}, "attempt": 0}))
    assert batch(str(trial), 0) == 0
    assert (trial / "ran").read_text() == "x\n" and json.loads((trial / META_DIR / STATE).read_text())["exit_code"] == 0
    assert batch(str(trial), 0) == 0  # requeued: not twice
    assert "started by an earlier run of this job; not twice" in capsys.readouterr().err
    assert (trial / "ran").read_text() == "x\n"
    set_aside_earlier_run(LOCAL, str(trial), 1)
    (trial / META_DIR).mkdir()
    write_atomic(str(trial / META_DIR / KEEPER_SPEC), json.dumps({"command": "echo y >> ran", "cwd": str(trial),
                                                                  "env": {}, "attempt": 1}))
    assert batch(str(trial), 0) == 0
    assert "took over from run 0; this job runs nothing" in capsys.readouterr().err
    assert not (trial / META_DIR / KEEPER_LOCK).exists() and (trial / "ran").read_text() == "x\n"
    assert batch(str(trial), 1) == 0 and (trial / "ran").read_text() == "x\ny\n"


def test_a_trial_cancelled_before_its_batch_job_ran_never_starts(tmp_path, capsys):
    """Slurm's cancel of a job that had not run yet: the trial is claimed with its end recorded, so a late
    (or requeued) run of the job runs nothing; a trial already started, or gone, is left as it is."""
    from trialflow.trial.keeper import batch, main
    from trialflow.trial.procs import write_atomic
    from trialflow.trial.protocol import KEEPER_SPEC, META_DIR, STATE

    trial = tmp_path / "trials" / "Never1"
    (trial / META_DIR).mkdir(parents=True)
    write_atomic(str(trial / META_DIR / KEEPER_SPEC), json.dumps({"command": "touch ran", "cwd": str(trial),
                                                                  "env": {}, "attempt": 0}))
    assert main(["--never-start", str(trial)]) == 0
    assert json.loads((trial / META_DIR / STATE).read_text())["never_started"] is True
    assert batch(str(trial), 0) == 0 and not (trial / "ran").exists()
    assert "not twice" in capsys.readouterr().err
    assert main(["--never-start", str(tmp_path / "trials" / "Gone1")]) == 0
    assert not (tmp_path / "trials" / "Gone1").exists()
