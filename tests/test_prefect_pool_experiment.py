"""Experiments end to end on ``platform: prefect`` -- a real ``prefect server start``, a ``process``
work pool and a real worker: 6 trials at concurrency 3 to DONE with every metric stored; SIGKILL of
the controller and ``trialflow resume`` re-attach the running flow runs; a worker killed mid-trial
ends its trials as the state table says and the experiment goes on; the metrics tokens never appear
in flow-run parameters, logs or artifacts."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
import yaml

from tests.conftest import base_config, prefect_section, run_until_running_then_sigkill, wait_for, write_trial
from tests.test_kubernetes_experiment import _check_done
from tests.test_remote_experiment import TRIAL, _events, _peak
from trialflow import load_config, run_experiment
from trialflow.experiments import open_store

pytestmark = pytest.mark.timeout(900)


def pool_experiment(tmp_path, pool, reuse=False, sleep=0.1, **overrides):
    write_trial(tmp_path / "code", TRIAL.format(log=str(tmp_path / "events.jsonl"), sleep=sleep))
    return base_config(tmp_path / "code", tmp_path / "w", trialCommand="python3 trial.py",
                       trainingService=prefect_section(pool, reuse), **overrides)


def _runs_of(experiment_id):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            name=FlowRunFilterName(like_=f"nni_exp_{experiment_id}_")))
    return runs


@pytest.mark.parametrize("reuse", [False, True], ids=["run-per-trial", "reuse"])
def test_six_trials_at_concurrency_three(tmp_path, on_pool, reuse):
    result = run_experiment(pool_experiment(tmp_path, on_pool, reuse, trialConcurrency=3, maxTrialNumber=6))
    assert result.status == "DONE"
    store = open_store(tmp_path / "w", result.experiment_id)
    _check_done(tmp_path, store, result.trials, 6)
    assert _peak(_events(tmp_path)) <= 3
    runs = _runs_of(result.experiment_id)
    names = [r.name for r in runs]
    assert len(names) == len(set(names))
    if reuse:
        assert 1 <= len(runs) <= 3  # environments: never more than trials in flight
    else:
        assert sorted(names) == sorted(f"nni_exp_{result.experiment_id}_trial_{t.id}" for t in result.trials)
        assert all(r.state.type.value == "COMPLETED" for r in runs)
    _linked_to_the_sweep_and_tidy(store.experiment().flow_run_id, result.experiment_id, runs)


def _linked_to_the_sweep_and_tidy(sweep_id: str, experiment_id: str, runs) -> None:
    """The work pool's runs are subflow runs of the sweep's run (its Subflow Runs tab lists them), tagged
    as it is; their logs and the sweep's hold no metric protocol line; the runner's deployment made for
    the experiment is gone at its end."""
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterParentFlowRunId,
        LogFilter,
        LogFilterFlowRunId,
    )
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        sweep = client.read_flow_run(UUID(sweep_id))
        subflows = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[sweep.id])))
        assert sorted(r.name for r in subflows) == sorted(r.name for r in runs)
        assert all({"trialflow", experiment_id, "prefect"} <= set(r.tags) for r in runs), [r.tags for r in runs]
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[sweep.id, *(r.id for r in runs)])))
        assert logs and not [entry.message for entry in logs if "NNISDK" in entry.message]
        with pytest.raises(ObjectNotFound):
            client.read_deployment_by_name(f"trialflow-trial/trialflow-{experiment_id}")


def test_controller_sigkill_and_trialflow_resume_reattach_running_flow_runs(tmp_path, on_pool):
    config_file = tmp_path / "config.yml"
    # each submission saves the trial's token as a Secret block, which `prefect server start` on SQLite
    # often answers 503 (database is locked) and the client retries after ~2 s: the second trial may
    # start seconds after the first, so trials last long enough (3 x 4 s) to be seen running together
    config_file.write_text(yaml.safe_dump(pool_experiment(tmp_path, on_pool, sleep=4, trialConcurrency=2,
                                                          maxTrialNumber=4)))
    exp_id, exp_dir, store = run_until_running_then_sigkill(load_config(config_file), on_pool.url,
                                                            config_path=str(config_file))
    resumed = subprocess.run(["trialflow", "resume", exp_id, "--root", str(exp_dir.parent), "--foreground"],
                             capture_output=True, text=True, timeout=600, env={**os.environ, **on_pool.env})
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert store.experiment().status == "DONE"
    _check_done(tmp_path, store, store.trials(), 4)
    assert len(_runs_of(exp_id)) == 4  # none re-run


def test_a_worker_killed_mid_trial_interrupts_its_trial_which_runs_again(tmp_path, on_pool):
    """The worker and the trial's flow run die at once, as when their machine or container goes: the
    run is Crashed, an interruption -- the trial runs again with the same parameters, the tuner never
    hears of a failure -- and the experiment goes on."""
    from trialflow import parse_config
    from trialflow.experiments import create_experiment

    code = tmp_path / "code"
    write_trial(code, "import nni, os, time\np = nni.get_next_parameter()\n"
                      "time.sleep(p['x'] if os.environ['TRIALFLOW_ATTEMPT'] == '0' else 0.1)\n"
                      "nni.report_final_result(p['x'])\n")
    config = base_config(code, tmp_path / "w", trialCommand="python3 trial.py", trialConcurrency=1,
                         # the first trial would outlive by far the 20 s its dead runner's heartbeat is trusted
                         maxTrialNumber=2, searchSpace={"x": {"_type": "choice", "_value": [90, 1]}},
                         tuner={"name": "GridSearch"}, trainingService=prefect_section(on_pool))
    exp_id, exp_dir = create_experiment(parse_config(config))
    store = open_store(exp_dir.parent, exp_id)
    controller = subprocess.Popen(["trialflow", "resume", exp_id, "--root", str(exp_dir.parent), "--foreground"],
                                  env={**os.environ, **on_pool.env}, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: [t.status for t in store.trials()] == ["RUNNING"], timeout=180, interval=0.5)
        # the worker and the trial's flow run die at once, as when their machine or container goes: the
        # flow run's process runs in a session of its own, and its trial in another
        runner = _parent(os.getsid(wait_for(lambda: _processes_of_trial(store.trials()[0].id), timeout=60)[0]))
        os.killpg(on_pool.worker.pid, signal.SIGKILL)
        os.kill(runner, signal.SIGKILL)
        on_pool.worker.wait()
        on_pool.worker = on_pool.spawn(["prefect", "worker", "start", "--pool", "trialflow-pool", "--limit", "20"],
                                       on_pool.worker_log.with_suffix(".2.log"), PREFECT_LOGGING_LEVEL="INFO")
        assert controller.wait(timeout=300) == 0
    finally:
        if controller.poll() is None:
            controller.kill()
    trials = store.trials()
    assert store.experiment().status == "DONE"
    assert [t.status for t in trials] == ["SUCCEEDED", "SUCCEEDED"], [(t.status, t.message) for t in trials]
    # its flow run reports nothing more: Prefect's worker or the missed heartbeat sets it Crashed, and the
    # trial runs again as a run of its own
    assert trials[0].final == 90 and trials[0].handle["data"]["attempt"] == 1 and trials[1].final == 1
    [note] = [m for _, _, m in store.status_history(trials[0].id) if m and "interrupted" in m]
    assert note.startswith("interrupted; run again as attempt 1: flow run ") and "crashed" in note
    crashed = next(r for r in _runs_of(exp_id) if r.name.endswith(trials[0].id))
    assert crashed.state.type.value == "CRASHED"  # Prefect agrees
    assert next(r for r in _runs_of(exp_id) if r.name.endswith(f"{trials[0].id}_r1")).state.type.value == "COMPLETED"
    # and the trial's own processes went with its runner (a SIGKILLed runner leaves them to its watchdog)
    wait_for(lambda: not _processes_of_trial(trials[0].id), timeout=30, interval=0.5)


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def _processes_of_trial(trial_id: str) -> list[int]:
    """The processes of this machine running the trial (its NNI_TRIAL_JOB_ID in their environment)."""
    needle = f"NNI_TRIAL_JOB_ID={trial_id}".encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as environ:
                if needle in environ.read().split(b"\0"):
                    found.append(int(pid))
        except OSError:
            pass
    return found
