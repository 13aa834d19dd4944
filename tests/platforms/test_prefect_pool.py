"""``platform: prefect`` against a real ``prefect server start`` with a ``process`` work pool and a
real worker: the contract (reuse on and off), trials as flow runs of the trial-runner deployment
(no secret in their parameters), the state table, cancel through Prefect, and a retried submit that
never makes a second run."""

from __future__ import annotations

import time

import pytest

from tests.conftest import FINAL_ONLY, job_platform, prefect_section, service_of, submit_one, wait_for
from trialflow.platforms import PlatformError, TrialStatus
from trialflow.platforms.prefect_pool import STATES, secret_name
from trialflow.testing.contract import (
    SLEEPING_TRIAL,
    InterruptionContract,
    JobPlatformContract,
    poll_until_terminal,
    prepared,
    wait_for_result,
)

VARIANTS = {"prefect": (False, "http"), "prefect-reuse": (True, "http")}
pool_service, service, _run_one = job_platform(prefect_section, "on_pool", VARIANTS)
pytestmark = [pytest.mark.timeout(600), pytest.mark.usefixtures("on_pool")]


class TestPrefectPoolContract(JobPlatformContract):
    pass


class TestPrefectPoolInterruptions(InterruptionContract):
    """The trial's flow run crashes as when its machine or container goes: its process is killed."""

    @pytest.fixture
    def service(self, tmp_path, on_pool):
        svc = prepared(pool_service(tmp_path, on_pool), tmp_path / "code")
        yield svc
        svc.close()

    @pytest.fixture
    def interrupt(self):
        import os
        import signal

        from tests.test_prefect_pool_experiment import _parent, _processes_of_trial

        def kill_runner(handle):
            trial = wait_for(lambda: _processes_of_trial(handle.trial_id), timeout=60)[0]
            os.kill(_parent(os.getsid(trial)), signal.SIGKILL)  # the flow run's process
            return f"flow run {handle.data['job']} crashed"
        return kill_runner


def _flow_run(pool, name):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name])))
    return runs


def test_each_trial_is_a_flow_run_on_the_pool_with_no_secret_in_its_parameters(tmp_path, on_pool):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    svc, handle = _run_one(tmp_path, on_pool, "Run1", 'print("hello from the pool")\n' + FINAL_ONLY)
    token = svc.read_token(f"{handle.data['job']}-token")
    assert poll_until_terminal(svc, handle, timeout=120)[0][-1] == TrialStatus.SUCCEEDED
    (run,) = _flow_run(on_pool, handle.data["job"])
    assert run.state.type.value == "COMPLETED" and run.work_pool_name == "trialflow-pool"
    assert run.parameters["token_block"] == secret_name(f"{handle.data['job']}-token")
    assert run.parameters["trial"] == {"id": "Run1", "parameters": {"x": 1}}  # shown with the run
    def logs():
        with get_client(sync_client=True) as client:
            return [log.message for log in client.read_logs(log_filter=LogFilter(
                flow_run_id=LogFilterFlowRunId(any_=[run.id])))]
    wait_for(lambda: "hello from the pool" in logs(), timeout=30)  # the trial's output in the run's logs
    assert token and token not in run.model_dump_json()  # the token is in a Secret block, not a parameter
    assert svc.read_token(f"{handle.data['job']}-token") is None  # deleted with its trial
    svc.close()


def test_a_process_pool_s_worker_starts_each_trial_s_engine_itself_in_this_interpreter(tmp_path, on_pool, capfd):
    """On a process pool the deployment's command is this interpreter running Prefect's engine (less
    the last collection at exit), so the worker starts each run's engine as its own child: no workspace
    supervisor between them (a second Prefect start per trial). Deploying it prints nothing (a foreground
    command's live table is on that terminal). A command the config gives stays; a pool type without one
    gets none."""
    import os
    import shlex
    import sys
    from pathlib import Path

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    from tests.test_prefect_pool_experiment import _parent, _processes_of_trial

    # ends by itself: a cancel would hold the worker's next submissions (its kill grace)
    svc, handle = _run_one(tmp_path, on_pool, "Eng1", "import nni, time\nnni.get_next_parameter()\n"
                           "time.sleep(6)\nnni.report_final_result(1.0)\n")
    assert capfd.readouterr().out == ""
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment(svc.deployment_id)
    command = shlex.split(deployment.job_variables["command"])
    assert command[0] == sys.executable and "runpy.run_module('prefect.engine'" in command[-1]
    trial = wait_for(lambda: _processes_of_trial("Eng1"), timeout=120)[0]
    engine = _parent(os.getsid(trial))  # the flow run's process, as the interruption test kills it
    assert _parent(engine) == on_pool.worker.pid
    assert Path(f"/proc/{engine}/cmdline").read_bytes().split(b"\0")[:-1] == [part.encode() for part in command]
    assert poll_until_terminal(svc, handle, timeout=120)[0][-1] == TrialStatus.SUCCEEDED
    svc.close()
    for other_home in ("given", "other"):
        (tmp_path / other_home / "code").mkdir(parents=True)
    given = pool_service(tmp_path / "given", on_pool, jobVariables={"command": "python -m prefect.engine"})
    assert given._deployment_job_variables() == {"command": "python -m prefect.engine"}
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name="trialflow-docker", type="docker"), overwrite=True)
    other = pool_service(tmp_path / "other", on_pool, workPool="trialflow-docker", jobVariables={"image": "x"})
    assert other._deployment_job_variables() == {"image": "x"}


@pytest.mark.parametrize("state,expected", [
    ("SCHEDULED", TrialStatus.WAITING), ("PENDING", TrialStatus.WAITING), ("PAUSED", TrialStatus.WAITING),
    ("RUNNING", TrialStatus.RUNNING), ("CANCELLING", TrialStatus.RUNNING), ("COMPLETED", TrialStatus.SUCCEEDED),
    ("FAILED", TrialStatus.FAILED), ("CRASHED", TrialStatus.FAILED), ("CANCELLED", TrialStatus.SYS_CANCELED),
])
def test_prefect_state_table(tmp_path, on_pool, state, expected):
    assert pool_service(tmp_path, on_pool).apply_states("j", state, STATES) == expected


SAVES_SLOWLY_ON_SIGTERM = """
import os, signal, sys, time
import nni
nni.get_next_parameter()
def save(signum, frame):
    print(f"saving on signal {signum}", flush=True)
    time.sleep(6)  # longer than the watchdog's 5 s, within the runner's grace
    with open(os.path.join(os.environ["TRIALFLOW_CHECKPOINT_DIR"], "saved"), "w") as f:
        f.write("ok")
    sys.exit(1)
signal.signal(signal.SIGTERM, save)
nni.report_intermediate_result(1.0)
time.sleep(120)
"""


def test_cancelling_a_trial_cancels_its_flow_run_and_gives_the_trial_time_to_save(tmp_path, on_pool):
    """The cancel ends the trial's flow run (CANCELLED in Prefect) as a container runtime stops a
    container: the trial gets SIGTERM once (through its keeper) and time to save its work; its exit
    with a code of its own after the stop is the stop's, not a failure. The experiment's end (``close``)
    leaves the run's deployment until the run has ended: the worker runs its cancellation hooks from it."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    svc, handle = _run_one(tmp_path, on_pool, "Can1", SAVES_SLOWLY_ON_SIGTERM)
    wait_for_result(svc, handle, timeout=60)  # 120 s with the pool's stall; it handles SIGTERM once it has reported
    logged_before = on_pool.worker_log.stat().st_size
    svc.cancel(handle, TrialStatus.USER_CANCELED)
    svc.close()  # as an experiment stopped with this trial running ends: the trial is still saving
    (run,) = _flow_run(on_pool, handle.data["job"])
    assert run.state.type.value == "CANCELLED"
    with get_client(sync_client=True) as client, pytest.raises(ObjectNotFound):
        client.read_deployment(svc.deployment_id)
    with on_pool.worker_log.open() as log:
        log.seek(logged_before)
        assert "failed to retrieve flow" not in log.read()
    statuses, _, last = poll_until_terminal(svc, handle)
    trial_dir = svc.storage.path(svc.experiment_id, "trials", handle.trial_id)
    assert (trial_dir / "checkpoint" / "saved").read_text() == "ok"
    assert (trial_dir / "trial.stdout").read_text().count("saving on signal") == 1  # not once per process
    assert (statuses[-1], last.exit_code, last.message) == (TrialStatus.USER_CANCELED, None,
                                                            "exit code 1 after a stop signal")


def test_the_end_removes_the_deployment_soon_after_a_run_cancelled_before_it_started(tmp_path, on_pool):
    """A run cancelled after a worker took it (Pending) but before its process started stays Cancelling
    in Prefect: a process worker told of the cancel before it has the run's process stops nothing, and
    Prefect refuses the engine's Running. Seen with a cancel ~0.75 s after the submit on this pool: the
    experiment's end then waited the full DEPLOYMENT_WAIT and left the deployment behind. Here the worker
    that took the run is the test's Pending, on a pool no worker serves, and the end removes the
    deployment after UNSTARTED_WAIT."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound
    from prefect.states import Pending

    from trialflow.platforms.prefect_pool import DEPLOYMENT_WAIT

    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name="trialflow-no-worker", type="process"), overwrite=True)
    svc, handle = _run_one(tmp_path, on_pool, "Early1", workPool="trialflow-no-worker")
    (run,) = _flow_run(on_pool, handle.data["job"])
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(run.id, Pending())  # as a worker that took it
    svc.cancel(handle, TrialStatus.USER_CANCELED)
    began = time.monotonic()
    svc.close()
    took = time.monotonic() - began
    (run,) = _flow_run(on_pool, handle.data["job"])
    assert run.state.type.value == "CANCELLING" and run.start_time is None
    with get_client(sync_client=True) as client, pytest.raises(ObjectNotFound):
        client.read_deployment(svc.deployment_id)
    assert took < DEPLOYMENT_WAIT - 10


def test_a_retried_submit_returns_the_same_flow_run(tmp_path, on_pool):
    svc, handle = _run_one(tmp_path, on_pool, "Twice1")
    svc.forget_state(handle.data["job"])
    svc._ids.clear()  # as a fresh attempt would: no remembered run id
    again = submit_one(svc, tmp_path, "Twice1", FINAL_ONLY)
    assert again.data["job"] == handle.data["job"]
    assert len(_flow_run(on_pool, handle.data["job"])) == 1  # the idempotency key kept it one run
    assert poll_until_terminal(svc, handle, timeout=120)[0][-1] == TrialStatus.SUCCEEDED
    svc.close()


def test_a_missing_work_pool_is_a_clear_error(tmp_path, on_pool):
    with pytest.raises(PlatformError, match="work pool 'nope' does not exist .*prefect work-pool create nope"):
        service_of(tmp_path, prefect_section(on_pool, workPool="nope")).prepare()


def _running_without_a_worker(tmp_path, on_pool, monkeypatch, trial_id: str, **fields):
    """A trial's run on a pool no worker polls, put Running by hand as a worker that died right after
    starting it would leave it, with a 3 s heartbeat window: ``(service, handle)``."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.states import Running

    import trialflow.platforms.prefect_pool as prefect_pool

    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name="trialflow-no-worker", type="process"), overwrite=True)
    monkeypatch.setattr(prefect_pool, "STALE_SECONDS", 3.0)
    svc, handle = _run_one(tmp_path, on_pool, trial_id, SLEEPING_TRIAL, workPool="trialflow-no-worker", **fields)
    (run,) = _flow_run(on_pool, handle.data["job"])
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(run.id, Running(), force=True)
    return svc, handle


def test_a_run_whose_process_died_before_its_first_heartbeat_interrupts_its_trial(tmp_path, on_pool, monkeypatch):
    """Prefect sets a run Running before the flow's first heartbeat: a worker killed in between left
    the trial RUNNING for ever. The run is set Crashed, an interruption (the trial runs again), and a
    failure once ``maxInterruptions`` is used up."""
    svc, handle = _running_without_a_worker(tmp_path, on_pool, monkeypatch, "Died1")
    update = wait_for(lambda: (u := svc.poll(handle, {})).interrupted is not None and u, timeout=60)
    assert update.status == TrialStatus.WAITING and "stopped beating" in update.interrupted
    (run,) = _flow_run(on_pool, handle.data["job"])
    assert run.state.type.value == "CRASHED" and "stopped beating" in run.state.message
    svc.close()

    svc, handle = _running_without_a_worker(tmp_path, on_pool, monkeypatch, "Died2", maxInterruptions=0)
    statuses, _, update = poll_until_terminal(svc, handle, timeout=60)
    assert statuses[-1] == TrialStatus.FAILED and "(maxInterruptions: 0)" in update.message
    svc.close()


def test_a_run_that_went_after_its_command_exited_0_leaves_its_trial_succeeded(tmp_path, on_pool, monkeypatch):
    """A runner whose trial's command exited 0 but which never reported its end (its process went, or
    stalled past the heartbeat window on a busy machine) is Crashed in Prefect, and the trial keeps
    its own outcome: SUCCEEDED with exit code 0. The trial's end is written as its keeper writes it."""
    import json

    svc, handle = _running_without_a_worker(tmp_path, on_pool, monkeypatch, "Ended1")
    meta = svc.storage.path(svc.experiment_id, "trials", handle.trial_id) / ".nni"
    (meta / "state").write_text(json.dumps({"exit_code": 0, "end_time": 0}))
    statuses, _, update = poll_until_terminal(svc, handle, timeout=60)
    assert (statuses[-1], update.exit_code) == (TrialStatus.SUCCEEDED, 0), update.message
    (run,) = _flow_run(on_pool, handle.data["job"])
    assert run.state.type.value == "CRASHED" and "stopped beating" in run.state.message  # Prefect is told
    svc.close()
