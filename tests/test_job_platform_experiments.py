"""Experiments end to end on OpenPAI, DLTS, PAI-DLC and Azure ML (emulators, Prefect test server): the
documented examples run 6 trials at concurrency 3 to DONE, reuse on and off, every metric stored;
SIGKILL of the controller and ``trialflow resume`` re-attach running jobs, none lost and none run
twice; a storm of 429/5xx answers and dropped connections at 20% of requests loses nothing and
makes no duplicate job."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import (
    aml_section,
    base_config,
    dlc_section,
    dlts_section,
    openpai_section,
    run_until_running_then_sigkill,
    write_trial,
)
from tests.test_kubernetes_experiment import _check_done
from tests.test_remote_experiment import TRIAL, _events, _peak
from trialflow import load_config, run_experiment
from trialflow.experiments import open_store
from trialflow.foundation.ids import lowercase_id
from trialflow.trial.verdicts import VERDICT_WAIT_SECONDS

pytestmark = pytest.mark.usefixtures("prefect_server")
CASES = {"openpai": ("openpai", False), "openpai-reuse": ("openpai", True), "dlts": ("dlts", False),
         "dlts-reuse": ("dlts", True), "dlc": ("dlc", False), "dlc-reuse": ("dlc", True), "aml": ("aml", False),
         "aml-reuse": ("aml", True)}
SECTIONS = {"openpai": openpai_section, "dlts": dlts_section, "dlc": dlc_section, "aml": aml_section}


@pytest.fixture
def emulators(request):
    return {name: request.getfixturevalue(f"{name}_emulator") for name in SECTIONS}


def job_experiment(tmp_path, emulator, platform, reuse, sleep=0.1, **overrides):
    write_trial(tmp_path / "code", TRIAL.format(log=str(tmp_path / "events.jsonl"), sleep=sleep))
    section = SECTIONS[platform](emulator, reuse)
    return base_config(tmp_path / "code", tmp_path / "w", trialCommand="python3 trial.py", trainingService=section,
                       **overrides)


def _jobs_of(emulator, platform, experiment_id):
    prefix = f"nni_exp_{experiment_id}_"
    if platform == "openpai":
        names = [p["name"] for p in emulator.submitted]
    elif platform == "dlts":
        names = [j.params["jobName"] for j in emulator.jobs.values()]
    elif platform == "dlc":
        names = [j.body["DisplayName"] for j in emulator.jobs.values()]
    else:
        names = list(emulator.jobs)
    return [n for n in names if n.startswith(prefix)]


@pytest.mark.parametrize("case", list(CASES))
def test_six_trials_at_concurrency_three(tmp_path, emulators, case):
    platform, reuse = CASES[case]
    emulator = emulators[platform]
    result = run_experiment(job_experiment(tmp_path, emulator, platform, reuse, trialConcurrency=3,
                                           maxTrialNumber=6))
    assert result.status == "DONE"
    store = open_store(tmp_path / "w", result.experiment_id)
    _check_done(tmp_path, store, result.trials, 6)
    assert _peak(_events(tmp_path)) <= 3
    jobs = _jobs_of(emulator, platform, result.experiment_id)
    assert len(jobs) == len(set(jobs))  # never a second job of one name
    if reuse:
        assert 1 <= len(jobs) <= 3 and all("_env_" in j for j in jobs)  # never more environments than in flight
    else:
        ids = [lowercase_id(t.id) if platform == "aml" else t.id for t in result.trials]  # AML: lowercase names
        assert sorted(jobs) == sorted(f"nni_exp_{result.experiment_id}_trial_{i}" for i in ids)


@pytest.mark.parametrize("case", ["openpai", "openpai-reuse", "dlts", "dlc-reuse", "aml"])
def test_controller_sigkill_and_trialflow_resume_reattach_running_jobs(tmp_path, emulators, prefect_server, case):
    platform, reuse = CASES[case]
    emulator = emulators[platform]
    config_file = tmp_path / "config.yml"  # the token and password come back from it on resume
    config_file.write_text(yaml.safe_dump(job_experiment(tmp_path, emulator, platform, reuse, sleep=1.0,
                                                         trialConcurrency=2, maxTrialNumber=4)))
    exp_id, exp_dir, store = run_until_running_then_sigkill(load_config(config_file), prefect_server,
                                                            config_path=str(config_file))
    resumed = subprocess.run(["trialflow", "resume", exp_id, "--root", str(exp_dir.parent), "--foreground"],
                             capture_output=True, text=True, timeout=240,
                             env={**os.environ, "PREFECT_API_URL": prefect_server})
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert store.experiment().status == "DONE"
    _check_done(tmp_path, store, store.trials(), 4)
    jobs = _jobs_of(emulator, platform, exp_id)
    assert len(jobs) == len(set(jobs))


@pytest.mark.parametrize("case", ["dlc", "dlc-reuse", "openpai", "aml"])
def test_a_storm_of_429_5xx_and_dropped_connections_loses_nothing(tmp_path, emulators, case):
    platform, reuse = CASES[case]
    emulator = emulators[platform]
    config = job_experiment(tmp_path, emulator, platform, reuse, trialConcurrency=3, maxTrialNumber=6)
    requests, hits = len(emulator.requests), emulator.storm_hits
    emulator.storm(0.2, seed=len(case))
    try:
        result = run_experiment(config)
    finally:
        emulator.storm(0)
    requests, hits = len(emulator.requests) - requests, emulator.storm_hits - hits
    assert hits >= 4 and hits / requests > 0.1  # the storm really blew
    assert result.status == "DONE"
    _check_done(tmp_path, open_store(tmp_path / "w", result.experiment_id), result.trials, 6)
    jobs = _jobs_of(emulator, platform, result.experiment_id)
    assert len(jobs) == len(set(jobs)), "a retried submit made a second job"


def test_a_resumed_experiment_without_its_token_says_where_to_keep_it(tmp_path, openpai_emulator):
    from trialflow import parse_config
    from trialflow.experiments import create_experiment, stored_config
    from trialflow.platforms import PlatformError, create_service

    exp_id, exp_dir = create_experiment(parse_config(job_experiment(tmp_path, openpai_emulator, "openpai", False)))
    stored = stored_config(open_store(exp_dir.parent, exp_id))  # what a controller without the file gets
    with pytest.raises(PlatformError, match="token is not stored with the experiment .*credentials"):
        create_service(stored.services[0], exp_dir)


STEPPING_TRIAL = """
import time, nni
p = nni.get_next_parameter()
for step in range(12):
    with open({log!r}, "a") as f:
        f.write(f"{{nni.get_trial_id()}} {{step}}\\n")
    nni.report_intermediate_result(p["x"])
nni.report_final_result(p["x"])
began = time.monotonic()
nni.report_intermediate_result(p["x"])  # after its final result: judged no more, so not held
with open({log!r}, "a") as f:
    f.write(f"{{nni.get_trial_id()}} held {{time.monotonic() - began}}\\n")
"""


@pytest.mark.parametrize("case", ["openpai", "openpai-reuse"])
def test_a_trial_stopped_at_report_time_through_the_metrics_receiver_takes_no_step_past_it(tmp_path, emulators,
                                                                                          case):
    """A job's trial with the HTTP metric channel asks the assessor as it reports (through the metrics
    receiver, with its token): a trial below the median is stopped before it begins another step."""
    platform, reuse = CASES[case]
    log = tmp_path / "began.txt"
    write_trial(tmp_path / "code", STEPPING_TRIAL.format(log=str(log)))
    config = base_config(tmp_path / "code", tmp_path / "w", trialCommand="python3 trial.py",
                         trainingService=SECTIONS[platform](emulators[platform], reuse), trialConcurrency=1,
                         maxTrialNumber=4, searchSpace={"x": {"_type": "choice", "_value": [1, 10, 0, 0.5]}},
                         tuner={"name": "GridSearch"},
                         assessor={"name": "Medianstop", "classArgs": {"optimize_mode": "maximize", "start_step": 2}})
    result = run_experiment(config)
    began: dict[str, list[str]] = {}
    held: dict[str, float] = {}
    for line in log.read_text().splitlines():
        trial_id, step, *seconds = line.split()
        if seconds:
            held[trial_id] = float(seconds[0])
        else:
            began.setdefault(trial_id, []).append(step)
    trials = {t.parameters["x"]: t for t in result.trials}
    assert result.status == "DONE" and trials[10].status == "SUCCEEDED"
    assert held[trials[10].id] < VERDICT_WAIT_SECONDS / 2, "a result after the final one waited for the assessor"
    for x in (0, 0.5):  # stopped at its first result the median can judge (the third), no step begun after
        assert trials[x].status == "EARLY_STOPPED" and began[trials[x].id] == ["0", "1", "2"], (
            x, began, _what_the_trial_said(emulators[platform].storage_dir, trials[x].id))


def _what_the_trial_said(share: Path, trial_id: str) -> dict[str, str]:
    """The trial's stderr on the share (what a failed report-time assertion shows: a refused ask or push
    says itself there)."""
    return {str(path.relative_to(share)): path.read_text(errors="replace")[-2000:]
            for folder in share.rglob(trial_id) if (path := folder / "trial.stderr").is_file()}
