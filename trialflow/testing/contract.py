"""The contract every TrainingService meets, shipped so that a new platform (ours or a user's) is
held to it: a platform's test module subclasses :class:`TrainingServiceContract` and provides the
``service`` and ``make_spec`` fixtures; the class's tests then run against that platform for real
(its emulator, sshd, or local processes). Modelled on Optuna's ``StorageTestCase``. Needs pytest."""

from __future__ import annotations

import dataclasses
import json
import secrets
import shutil
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from trialflow.platforms import LostHandleError, TransientPlatformError, TrialHandle, TrialSpec, TrialStatus

TERMINAL_TIMEOUT = 60.0
# Prefect 3.8.8's process worker holds its next submissions while it cancels a run (its kill grace,
# 2 x 30 s): seen in a worker log, runs submitted right after a cancelled one started 62 s late.
START_STALL = {"prefect": 60.0}

REPORTING_TRIAL = """
import nni, time
p = nni.get_next_parameter()
for i in range(5):
    nni.report_intermediate_result({"default": p["x"] + i, "step": i, "latency_ms": 2.0 * i})
    time.sleep(0.05)
time.sleep(0.3)
nni.report_final_result({"default": p["x"] * 10, "accuracy": p["x"] * 10, "latency_ms": 9.5, "memory_gb": 1})
"""
FAILING_TRIAL = """
import sys
sys.stderr.write("something went wrong: boom\\n")
sys.exit(3)
"""
SLEEPING_TRIAL = """
import nni, time
nni.get_next_parameter()
nni.report_intermediate_result(1.0)
time.sleep(60)
"""

# answers a stop as a trial that saves its work does: a line, then exit 1 (a code of its own choosing);
# a trial run in a thread (the in-memory service) takes no signals, and its service stops it its own way
ANSWERING_TRIAL = """
import nni, signal, sys, threading, time
nni.get_next_parameter()
def answer(signum, frame):
    print("saving checkpoint", flush=True)
    sys.exit(1)
if threading.current_thread() is threading.main_thread():
    signal.signal(signal.SIGINT, answer)
    signal.signal(signal.SIGTERM, answer)
nni.report_intermediate_result(1.0)
time.sleep(60)
"""

# runs until the test has restarted the controller and adopted it: the file GATE appears (or 60 s pass)
ADOPTED_TRIAL = """
import nni, os, time
nni.get_next_parameter()
nni.report_intermediate_result(1.0)
deadline = time.monotonic() + 60
while not os.path.exists(GATE) and time.monotonic() < deadline:
    time.sleep(0.05)
nni.report_intermediate_result(2.0)
nni.report_final_result(3.0)
"""
LOGGING_TRIAL = """
import sys
print("hello from stdout " + "x" * 200)
sys.stderr.write("hello from stderr\\n")
"""

CHECKPOINT_TRIAL = """
import nni, os
p = nni.get_next_parameter()
before = os.path.join(p["load_checkpoint_dir"], "model.txt")
loaded = open(before).read() if os.path.isfile(before) else ""
with open(os.path.join(p["save_checkpoint_dir"], "model.txt"), "w") as f:
    f.write(loaded + nni.get_trial_id() + ";")
nni.report_final_result({"default": float(p["TRIAL_BUDGET"]), "loaded": loaded,
                         "save": p["save_checkpoint_dir"]})
"""

# checkpoints after each step; the first run of sequence 0 says it paused (``checkpoint/paused``) and
# waits to be interrupted after three steps, a later run goes on from the step its checkpoint holds.
# The pausing step saves its checkpoint before it reports too, so whoever saw its third result may
# interrupt it at once without the step being run twice.
RESUMING_TRIAL = """
import nni, os, time
p = nni.get_next_parameter()
checkpoint = os.environ["TRIALFLOW_CHECKPOINT_DIR"]
mark = os.path.join(checkpoint, "step")
start = int(open(mark).read()) if os.path.exists(mark) else 0
def save(done):
    with open(mark + ".tmp", "w") as f:
        f.write(str(done))
    os.replace(mark + ".tmp", mark)
for step in range(start, 6):
    pause = step == 2 and nni.get_sequence_id() == 0 and os.environ["TRIALFLOW_ATTEMPT"] == "0"
    if pause:
        save(step + 1)
    nni.report_intermediate_result(p["x"] + step)
    save(step + 1)
    if pause:
        open(os.path.join(checkpoint, "paused"), "w").close()
        time.sleep(120)
    time.sleep(0.05)
nni.report_final_result({"default": p["x"] * 10, "resumed_at": start, "attempt": os.environ["TRIALFLOW_ATTEMPT"]})
"""


def patience(service, seconds: float) -> float:
    """``seconds`` plus the platform's known start stall."""
    return seconds + START_STALL.get(service.platform, 0.0)


def poll_until_terminal(service, handle, cursor=None, timeout=None):
    """Poll like the flow does; returns (statuses seen, all metrics, last update). The default
    timeout allows for the platform's known start stalls (:data:`START_STALL`)."""
    timeout = patience(service, TERMINAL_TIMEOUT if timeout is None else timeout)
    cursor = cursor or {}
    statuses, metrics = [], []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        update = service.poll(handle, cursor)
        cursor = update.cursor
        metrics.extend(update.metrics)
        if not statuses or statuses[-1] != update.status:
            statuses.append(update.status)
        if update.status.is_terminal:
            return statuses, metrics, update
        service.wait(handle, 0.05)
    raise AssertionError(f"trial did not end within {timeout} s; statuses {statuses}")


SCRIPT_PER_TRIAL = 'python3 "$NNI_TRIAL_JOB_ID.py"'  # each trial runs the script named after it


def prepared(service, code_dir: Path):
    """``service`` prepared, with ``code_dir`` uploaded as ``service.code`` (what the fixtures yield)."""
    service.prepare()
    service.code = service.upload_code(code_dir)
    return service


def spec_maker(service, code_dir: Path, command: str = SCRIPT_PER_TRIAL):
    """A ``make_spec(trial_id, body, parameters, gpu_number=None)`` that writes ``<trial_id>.py`` into
    ``code_dir``, uploads the code again (so the script travels with it) and returns the trial's spec."""
    def make(trial_id, body, parameters, gpu_number=None):
        (code_dir / f"{trial_id}.py").write_text(textwrap.dedent(body), encoding="utf-8")
        service.code = service.upload_code(code_dir)
        return TrialSpec(service.experiment_id, trial_id, 0, 0, parameters, command, code_dir, gpu_number)
    return make


def submit_retrying(service, spec, code, attempts: int = 6):
    """``submit`` retried on transient errors, as the Prefect task does."""
    for _ in range(attempts):
        try:
            return service.submit(spec, code)
        except TransientPlatformError:
            time.sleep(0.1)
    raise AssertionError("submit never succeeded")


def wait_for_status(service, handle, status, timeout=30.0):
    """Poll until the trial reports ``status`` (``timeout`` plus the platform's start stall)."""
    timeout = patience(service, timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if service.poll(handle, {}).status == status:
            return
        time.sleep(0.05)
    raise AssertionError(f"trial {handle.trial_id} did not reach {status.value} within {timeout} s")


def wait_for_result(service, handle, timeout=30.0):
    """Poll until the trial's first intermediate result arrives (``timeout`` plus the platform's start
    stall); fails when it ends first. Returns the metric cursor after it."""
    deadline = time.monotonic() + patience(service, timeout)
    cursor = {}
    while True:
        update = service.poll(handle, cursor)
        cursor = update.cursor
        if any(m.type == "PERIODICAL" for m in update.metrics):
            return cursor
        assert not update.status.is_terminal and time.monotonic() < deadline, (update.status, update.message)
        time.sleep(0.05)


class TrainingServiceContract:
    """Subclass and provide fixtures ``service`` (prepared, with code uploaded as ``service.code``)
    and ``make_spec(trial_id, script_body, parameters)``. ``reopen`` (a fresh, prepared service for the
    same experiment, as a restarted controller makes) and :meth:`crash` have defaults a platform may
    override."""

    @pytest.fixture
    def reopen(self, service):
        made = []

        def make():
            fresh = type(service)(service.config, service.experiment_dir)
            fresh.prepare()
            made.append(fresh)
            return fresh

        yield make
        for fresh in made:
            fresh.close()

    def crash(self, service):
        """Make ``service`` let go of the experiment as a killed controller would (default: close it;
        running trials are not touched by ``close``)."""
        service.close()

    def test_adopt_reattaches_a_running_trial_after_a_controller_restart(self, service, make_spec, reopen):
        gate = Path(tempfile.mkdtemp(prefix="trialflow-adopt-")) / "go"
        body = ADOPTED_TRIAL.replace("GATE", repr(str(gate)))
        handle = service.submit(make_spec("Adopt1", body, {}), service.code)
        wait_for_status(service, handle, TrialStatus.RUNNING)
        stored = json.loads(json.dumps(handle.to_dict()))
        self.crash(service)
        fresh = reopen()
        adopted = TrialHandle.from_dict(stored)
        fresh.adopt(adopted)
        assert not fresh.poll(adopted, {}).status.is_terminal  # still running when adopted
        gate.touch()
        statuses, metrics, update = poll_until_terminal(fresh, adopted)
        shutil.rmtree(gate.parent, ignore_errors=True)
        assert statuses[-1] == TrialStatus.SUCCEEDED and update.exit_code == 0
        assert [m.value for m in metrics if m.type == "FINAL"] == [3.0]
        assert 2.0 in [m.value for m in metrics if m.type == "PERIODICAL"]  # reported after the restart

    def test_logs_hold_the_trials_output_and_honour_tail(self, service, make_spec):
        handle = service.submit(make_spec("Logs1", LOGGING_TRIAL, {}), service.code)
        assert poll_until_terminal(service, handle)[0][-1] == TrialStatus.SUCCEEDED
        logs = service.logs(handle)
        assert "hello from stdout " + "x" * 200 in logs["trial.stdout"]
        assert "hello from stderr" in logs["trial.stderr"]
        tail = service.logs(handle, tail=50)
        assert 0 < len(tail["trial.stdout"].encode()) <= 50 and tail["trial.stdout"].endswith("x" * 20)

    def test_submit_returns_before_the_trial_ends(self, service, make_spec):
        spec = make_spec("Subm1", SLEEPING_TRIAL, {"x": 1})
        started = time.monotonic()
        handle = service.submit(spec, service.code)
        assert time.monotonic() - started < 10
        assert json.loads(json.dumps(handle.to_dict())) == handle.to_dict()  # storable
        assert not service.poll(handle, {}).status.is_terminal
        service.cancel(handle, TrialStatus.USER_CANCELED)

    def test_lifecycle_and_metrics_in_order_without_duplicates(self, service, make_spec):
        handle = service.submit(make_spec("Life1", REPORTING_TRIAL, {"x": 0.5}), service.code)
        statuses, metrics, update = poll_until_terminal(service, handle)
        assert statuses[-1] == TrialStatus.SUCCEEDED and update.exit_code == 0
        assert TrialStatus.RUNNING in statuses or statuses[0] == TrialStatus.WAITING
        order = [s for s in statuses if s in (TrialStatus.WAITING, TrialStatus.RUNNING, TrialStatus.SUCCEEDED)]
        assert order == sorted(order, key=[TrialStatus.WAITING, TrialStatus.RUNNING, TrialStatus.SUCCEEDED].index)
        periodical = [m for m in metrics if m.type == "PERIODICAL"]
        assert [m.sequence for m in periodical] == [0, 1, 2, 3, 4]
        assert [m.value["default"] for m in periodical] == [0.5, 1.5, 2.5, 3.5, 4.5]
        assert [m.value["latency_ms"] for m in periodical] == [0.0, 2.0, 4.0, 6.0, 8.0]  # several objectives
        finals = [m for m in metrics if m.type == "FINAL"]
        assert len(finals) == 1 and finals[0].trial_id == "Life1"
        assert finals[0].value == {"default": 5.0, "accuracy": 5.0, "latency_ms": 9.5, "memory_gb": 1}
        # a fresh cursor re-reads the same records; the old cursor yields nothing new
        again = poll_until_terminal(service, handle)[1]
        assert [m.sequence for m in again if m.type == "PERIODICAL"] == [0, 1, 2, 3, 4]
        assert service.poll(handle, update.cursor).metrics == []

    def test_parameters_are_bound_to_their_trial(self, service, make_spec):
        body = "import nni\np = nni.get_next_parameter()\nnni.report_final_result(p['x'])\n"
        handles = [service.submit(make_spec(f"Bnd{i}x", body, {"x": float(i)}), service.code) for i in range(4)]
        for i, handle in enumerate(handles):
            _, metrics, _ = poll_until_terminal(service, handle)
            assert [m.value for m in metrics if m.type == "FINAL"] == [float(i)]

    def test_failing_command_is_failed_with_exit_code_and_stderr_tail(self, service, make_spec):
        handle = service.submit(make_spec("Fail1", FAILING_TRIAL, {"x": 1}), service.code)
        statuses, _, update = poll_until_terminal(service, handle)
        assert statuses[-1] == TrialStatus.FAILED
        assert update.exit_code == 3
        assert "boom" in (update.message or "")

    def test_cancel_is_idempotent_also_after_the_end(self, service, make_spec):
        """A cancelled trial that answers the stop with a code of its own (it saves, then exits 1) ends
        with no exit code of its own choosing: the flow would take one as the trial's own end (FAILED),
        where it records the cancel's (it records its reason before it cancels, so the platform's
        status for the end may be any but SUCCEEDED). Cancelling twice, and again after the end, is no
        error."""
        handle = service.submit(make_spec("Canc1", ANSWERING_TRIAL, {"x": 1}), service.code)
        wait_for_result(service, handle)  # it handles the stop signals once it has reported
        service.cancel(handle, TrialStatus.USER_CANCELED)
        service.cancel(handle, TrialStatus.USER_CANCELED)
        statuses, _, last = poll_until_terminal(service, handle, timeout=30)
        assert statuses[-1].is_terminal and statuses[-1] != TrialStatus.SUCCEEDED, (statuses, last.message)
        assert last.exit_code is None or not 0 <= last.exit_code < 128, (last.exit_code, last.message)
        service.cancel(handle, TrialStatus.USER_CANCELED)  # after the end: no error

    def test_budgets_and_checkpoint_folders_reach_the_trials(self, service, make_spec):
        """Multi-fidelity on every platform: a trial gets its ``TRIAL_BUDGET``, and PBT's relative
        checkpoint folders resolve to one place per experiment, so a later step loads what an earlier
        trial saved."""
        def run(trial_id, step, budget):
            params = {"x": 1, "TRIAL_BUDGET": budget, "load_checkpoint_dir": f"checkpoint/0/{max(step - 1, 0)}",
                      "save_checkpoint_dir": f"checkpoint/0/{step}"}
            handle = service.submit(make_spec(trial_id, CHECKPOINT_TRIAL, params), service.code)
            statuses, metrics, _ = poll_until_terminal(service, handle)
            assert statuses[-1] == TrialStatus.SUCCEEDED
            [final] = [m.value for m in metrics if m.type == "FINAL"]
            return final

        first, second = run("Ckpt0", 0, 3), run("Ckpt1", 1, 9)
        assert (first["default"], second["default"]) == (3.0, 9.0)
        assert first["loaded"] == "" and second["loaded"] == "Ckpt0;"
        assert second["save"].endswith("checkpoint/0/1") and second["save"].startswith("/")

    def test_lost_handle_raises_a_clear_error(self, service, make_spec):
        lost = TrialHandle("Lost1", service.platform, {"trial_dir": "/nonexistent/trial", "job": "nope"})
        with pytest.raises(LostHandleError, match="Lost1"):
            service.poll(lost, {})


class JobPlatformContract(TrainingServiceContract):
    """The contract for job platforms on the shared-storage base (Kubernetes, OpenPAI, DLTS, ...):
    a platform's module provides only the ``service`` fixture (its trial command
    :data:`SCRIPT_PER_TRIAL`); ``make_spec`` writes each trial's script into its code directory."""

    # A variant that differs from a base one only in its metric channel (its id names the channel:
    # ``tfjob-file``, ``pytorchjob-logs-only``) runs the tests in which the channel carries something.
    CHANNEL_TESTS = frozenset({"test_metrics_arrive_on_the_configured_channel",
                               "test_lifecycle_and_metrics_in_order_without_duplicates",
                               "test_adopt_reattaches_a_running_trial_after_a_controller_restart"})

    @classmethod
    def runs_on_variant(cls, test_name: str, variant_id: str) -> bool:
        """Whether ``test_name`` runs on the ``service`` variant ``variant_id``: every test on a base or
        reuse variant, :data:`CHANNEL_TESTS` on a channel-only one."""
        channel_only = any(part in ("file", "logs") for part in variant_id.split("-"))
        return not channel_only or test_name in cls.CHANNEL_TESTS

    @pytest.fixture
    def make_spec(self, service):
        return spec_maker(service, Path(service.config.trial_code_directory))

    def crash(self, service):
        """A killed controller deletes nothing: its jobs and environments stay, its receiver is gone."""
        if service.receiver is not None:
            service.receiver.stop()
            service.receiver = None
        service.envs.clear()

    def test_metrics_arrive_on_the_configured_channel(self, service, make_spec):
        body = "import nni\nnni.get_next_parameter()\nnni.report_final_result(7.0)\n"
        handle = service.submit(make_spec("Chan1", body, {}), service.code)
        accepted = service.receiver.stats.accepted if service.receiver else 0
        _, metrics, _ = poll_until_terminal(service, handle)
        assert [m.value for m in metrics] == [7.0]
        if service.channel == "http":
            assert service.receiver.stats.accepted == accepted + 1  # pushed, not only read from logs


class InterruptionContract:
    """For a platform that reports interruptions: subclass beside the platform's contract and provide
    the fixtures ``service``, ``make_spec`` and ``interrupt(handle)``, which ends the trial's running
    run the way the platform's infrastructure does (a pod evicted, a job requeued) and returns words
    the service's report of it must hold (or a tuple of such words, one of which it must hold, where
    what the service sees depends on when it looks). ``make_spec`` defaults to job platforms' (each trial's
    script in the code directory)."""

    @pytest.fixture
    def make_spec(self, service):
        return spec_maker(service, Path(service.config.trial_code_directory))

    def test_an_interrupted_trial_resumes_from_its_checkpoint_and_succeeds(self, service, make_spec, interrupt):
        """The run is reported interrupted (not ended); the trial's next run, submitted as the flow does
        (the rest of the first cancelled, the same parameters as attempt 1, numbering on after the stored
        results), resumes from the checkpoint and succeeds: six intermediate results, each once, in order."""
        # an id of its own: a platform's ``interrupt`` may find the trial's processes by it, and other
        # tests may run this one's trial beside it
        spec = make_spec(f"Resume{secrets.token_hex(3)}", RESUMING_TRIAL, {"x": 2})
        handle = service.submit(spec, service.code)
        cursor, seen = {}, []
        deadline = time.monotonic() + patience(service, TERMINAL_TIMEOUT)
        while len(seen) < 3:
            assert time.monotonic() < deadline, f"the first run reported {seen} only"
            update = service.poll(handle, cursor)
            cursor = update.cursor
            seen += [m for m in update.metrics if m.type == "PERIODICAL"]
            assert not update.status.is_terminal, update.message
            service.wait(handle, 0.05)
        words = interrupt(handle)
        while True:
            assert time.monotonic() < deadline, "the interruption was never reported"
            update = service.poll(handle, cursor)
            cursor = update.cursor
            seen += [m for m in update.metrics if m.type == "PERIODICAL"]
            if update.interrupted is not None:
                break
            assert not update.status.is_terminal, f"ended {update.status.value} instead: {update.message}"
            service.wait(handle, 0.05)
        assert update.status == TrialStatus.WAITING, update.message
        assert any(w in update.interrupted for w in ((words,) if isinstance(words, str) else words)), \
            (words, update.interrupted)
        service.cancel(handle, TrialStatus.SYS_CANCELED)
        again = dataclasses.replace(spec, attempt=1, reported=max(m.sequence for m in seen) + 1)
        second = service.submit(again, service.code)
        statuses, metrics, last = poll_until_terminal(service, TrialHandle(second.trial_id, second.platform,
                                                                           {**second.data, "attempt": 1}))
        assert statuses[-1] == TrialStatus.SUCCEEDED, last.message
        periodical = seen + [m for m in metrics if m.type == "PERIODICAL"]
        assert [(m.sequence, m.value) for m in periodical] == [(i, 2 + i) for i in range(6)], \
            [(m.sequence, m.value) for m in periodical]
        [final] = [m.value for m in metrics if m.type == "FINAL"]
        assert final == {"default": 20, "resumed_at": 3, "attempt": "1"}
