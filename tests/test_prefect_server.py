"""The Prefect shape of an experiment, checked on a real ``prefect server start`` on 127.0.0.1: the
task runs of each trial, Prefect retries of transient submission errors only, task-run states that
mirror trials, a platform cap shared by two experiments, the block catalog, the work-pool deployment,
the nightly schedule (read back, and a near-term variant that fires) and a flow run cancelled from
the API."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from tests.conftest import base_config, wait_for, write_trial
from trialflow.experiments import list_experiments, open_store
from trialflow.testing.prefect_server import PrefectServer, stop_group

# One worker runs them all, so the module's ``prefect server start`` (~15 CPU-seconds to start and idle
# on a busy machine) starts once per run instead of once per worker
pytestmark = [pytest.mark.timeout(600), pytest.mark.e2e, pytest.mark.xdist_group("prefect_server_start")]
REPO = Path(__file__).resolve().parents[1]
TRIAL = """
import nni, sys, time
p = nni.get_next_parameter()
x = p["x"]
if x == 2:
    sys.stderr.write("bad x\\n"); sys.exit(3)
if x == 3:
    time.sleep(240)
time.sleep(0.5)
nni.report_final_result(x)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = PrefectServer(tmp_path_factory.mktemp("prefect-home")).start()
    yield srv
    srv.stop()


@pytest.fixture
def client(server):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: server.url}), get_client(sync_client=True) as c:
        yield c


def _config(tmp_path: Path, name: str, trial: str = TRIAL, **overrides) -> Path:
    code = tmp_path / f"code-{name}"
    write_trial(code, trial)
    cfg = base_config(code, tmp_path / "w", experimentName=name, **overrides)
    path = tmp_path / f"{name}.yml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _run(server: PrefectServer, tmp_path: Path, script: str, name: str, *args: str) -> None:
    log = tmp_path / f"{name}.log"
    proc = server.spawn([sys.executable, "-c", script, *args], log, TRIALFLOW_HOME=str(tmp_path / "home"))
    assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]


def _experiment(tmp_path: Path, name: str):
    return next(e for e in list_experiments(tmp_path / "w") if e.record.name == name)


def _task_run_logs(client, names: dict, trials: dict, timeout: float = 30.0) -> dict[str, list[str]]:
    """The log messages of the given task runs (id -> name), once each trial's run has its final line
    (logs reach the API in batches)."""
    from prefect.client.schemas.filters import LogFilter, LogFilterTaskRunId

    found: dict[str, list[str]] = {}

    def complete() -> bool:
        found.clear()
        for log in client.read_logs(log_filter=LogFilter(task_run_id=LogFilterTaskRunId(any_=list(names)))):
            found.setdefault(names[log.task_run_id], []).append(log.message)
        return len(found) == len(trials) and all(any(m.startswith("Finished in state") for m in messages)
                                                 for messages in found.values())

    wait_for(complete, timeout=timeout, interval=1.0)
    return found


def _task_runs(client, experiment_id: str, expected: int, timeout: float = 60.0):
    """The experiment's task runs once ``expected`` of them are final (states arrive as events)."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    runs: list = []

    def settled() -> bool:
        nonlocal runs
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[experiment_id])))
        return sum(1 for r in runs if r.state and r.state.is_final()) >= expected

    wait_for(settled, timeout=timeout, interval=1.0)
    return runs


def test_the_run_graph_links_every_trial_to_its_suggest_and_submit_runs(server, client, tmp_path):
    """Trials that end while later ones are still being created (the flow forgets a closed trial's
    task runs then) keep every edge of the run graph: suggest -> submit -> trial."""
    config = _config(tmp_path, "graph", maxTrialNumber=8, trialConcurrency=2,
                     searchSpace={"x": {"_type": "choice", "_value": [1, 4, 5, 6, 7, 8, 9, 10]}},
                     tuner={"name": "GridSearch"})
    _run(server, tmp_path, f"import trialflow; trialflow.run_experiment({str(config)!r})", "graph")
    exp = _experiment(tmp_path, "graph")
    trials = open_store(tmp_path / "w", exp.record.id).trials()
    assert len(trials) == 8 and all(t.status == "SUCCEEDED" for t in trials)
    runs = _task_runs(client, exp.record.id, 1 + 8 * 3)
    names = {r.id: r.name for r in runs}
    inputs = {r.name: {key: sorted(names[i.id] for i in value) for key, value in r.task_inputs.items() if value}
              for r in runs}
    for trial in trials:
        suggest = f"suggest-#{trial.sequence}"  # named by the sequence number it gives the trial
        assert inputs[f"submit-{trial.id}"] == {"trial_id": [suggest]}
        assert inputs[f"trial-{trial.id}"] == {"trial_id": [suggest], "wait_for": [f"submit-{trial.id}"]}


LINEAGE = """
import sys
import trialflow
from prefect import flow
from trialflow.tasks import poll_trial, submit_trial, suggest_parameters, upload_code

@flow(flow_run_name="lineage")
def lineage(config: str, code: str) -> None:
    with trialflow.experiment_session(config) as exp:
        upload_code(exp.id, code)
        trial = suggest_parameters(exp.id, 0)["trial_id"]
        submitted = submit_trial.submit(exp.id, trial)
        submitted.wait()  # the submit run has returned its handle before the poll run is created
        poll_trial(exp.id, trial, wait_for=[submitted])

lineage(sys.argv[1], sys.argv[2])
"""


def test_a_trial_created_after_its_submit_returned_still_takes_its_id_from_the_suggest_run(server, client, tmp_path):
    """The run graph does not depend on thread timing: a poll run created once its submit run has
    returned the trial's handle (the flow's pool threads were busy) still links its trial id to the
    suggest run, as one created at once does."""
    config = _config(tmp_path, "lineage", maxTrialNumber=1, searchSpace={"x": {"_type": "choice", "_value": [1]}})
    _run(server, tmp_path, LINEAGE, "lineage", str(config), str(tmp_path / "code-lineage"))
    runs = _task_runs(client, "lineage", 4)
    names = {r.id: r.name for r in runs}
    inputs = {r.name: {key: sorted(names[i.id] for i in value) for key, value in r.task_inputs.items() if value}
              for r in runs}
    [trial] = [name.removeprefix("trial-") for name in inputs if name.startswith("trial-")]
    assert inputs[f"submit-{trial}"] == {"trial_id": ["suggest-#0"]}
    assert inputs[f"trial-{trial}"] == {"trial_id": ["suggest-#0"], "wait_for": [f"submit-{trial}"]}


def test_each_trial_is_a_suggest_a_submit_and_a_poll_task_run_whose_state_mirrors_it(server, client, tmp_path):
    config = _config(tmp_path, "shape", maxTrialNumber=3, trialConcurrency=3, maxTrialDuration="3s",
                     searchSpace={"x": {"_type": "choice", "_value": [1, 2, 3]}}, tuner={"name": "GridSearch"})
    _run(server, tmp_path, f"import trialflow; trialflow.run_experiment({str(config)!r})", "shape")
    exp = _experiment(tmp_path, "shape")
    assert exp.record.status == "DONE"  # a failed trial never fails the experiment
    trials = {t.parameters["x"]: t for t in open_store(tmp_path / "w", exp.record.id).trials()}
    assert {x: t.status for x, t in trials.items()} == {1: "SUCCEEDED", 2: "FAILED", 3: "EARLY_STOPPED"}
    runs = _task_runs(client, exp.record.id, 1 + 3 * 3)
    names = Counter(r.name for r in runs)
    assert names[f"upload-{exp.record.id}"] == 1
    assert sorted(n for n in names if n.startswith("suggest-")) == ["suggest-#0", "suggest-#1", "suggest-#2"]
    for trial in trials.values():
        assert names[f"submit-{trial.id}"] == 1 and names[f"trial-{trial.id}"] == 1
    assert len(runs) == 1 + 3 * 3
    polls = {r.name: r.state for r in runs if r.name.startswith("trial-")}
    succeeded = polls[f"trial-{trials[1].id}"]
    assert succeeded.type.value == "COMPLETED" and succeeded.name == "Completed"
    failed = polls[f"trial-{trials[2].id}"]
    assert failed.type.value == "FAILED" and "exit code 3" in failed.message and "bad x" in failed.message
    early = polls[f"trial-{trials[3].id}"]
    assert early.type.value == "CANCELLED" and early.name == "EarlyStopped"  # drawn apart from successes
    logs = _task_run_logs(client, {r.id: r.name for r in runs if r.name.startswith("trial-")}, trials)
    failed_lines = logs[f"trial-{trials[2].id}"]
    assert f'trial {trials[2].id} (#{trials[2].sequence}), parameters: {{"x": 2}}' in failed_lines
    assert "[stderr] bad x" in failed_lines  # the trial's own output, line by line
    readable = [m for m in failed_lines if m.startswith(f"trial {trials[2].id} FAILED")]
    assert readable and "\nbad x" in readable[0]  # a real line break before the stderr tail
    assert not [m for m in failed_lines if "NoneType: None" in m or m.startswith("Task run failed with state")]
    flow_runs = client.read_flow_runs()
    assert [f.state.type.value for f in flow_runs if f.name == exp.record.id] == ["COMPLETED"]


FLAKY_SUBMIT = """
import sys, trialflow
from trialflow.platforms import PlatformError, TransientPlatformError
from trialflow.platforms.local import LocalTrainingService
real, calls, mode = LocalTrainingService.submit, [], sys.argv[2]
def submit(self, spec, code):
    calls.append(spec.trial_id)
    if mode == "permanent":
        raise PlatformError("the platform refused the job: quota exceeded")
    if len(calls) <= 2:
        raise TransientPlatformError(f"HTTP 503 on attempt {len(calls)}")
    return real(self, spec, code)
LocalTrainingService.submit = submit
trialflow.run_experiment(sys.argv[1])
"""


@pytest.mark.parametrize("mode", ["transient", "permanent"])
def test_submit_retries_transient_errors_with_prefect_and_never_a_permanent_one(server, client, tmp_path, mode):
    config = _config(tmp_path, mode, maxTrialNumber=1, searchSpace={"x": {"_type": "choice", "_value": [1]}})
    log = tmp_path / "flaky.log"
    proc = server.spawn([sys.executable, "-c", FLAKY_SUBMIT, str(config), mode], log,
                        TRIALFLOW_HOME=str(tmp_path / "home"))
    assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
    exp = _experiment(tmp_path, mode)
    trial = open_store(tmp_path / "w", exp.record.id).trials()[0]
    runs = _task_runs(client, exp.record.id, 4)
    submit = next(r for r in runs if r.name == f"submit-{trial.id}")
    history = [s.name for s in client.read_task_run_states(submit.id)]
    if mode == "transient":
        assert trial.status == "SUCCEEDED"
        assert history.count("AwaitingRetry") == 2 and submit.run_count == 3 and history[-1] == "Completed"
    else:
        assert trial.status == "FAILED" and "quota exceeded" in (trial.message or "")
        assert "AwaitingRetry" not in history and submit.run_count == 1 and history[-1] == "Failed"
    assert exp.record.status == "DONE"


@pytest.mark.parametrize("platform,cap", [("local", 2), ("dlc", 3)])
def test_a_platform_cap_holds_across_two_experiments(server, client, tmp_path, request, platform, cap):
    """PAI-DLC quotas are small: its examples set platformConcurrency (3) for every experiment together."""
    space = {"x": {"_type": "choice", "_value": [1, 4, 5, 6]}}
    service = {"platform": "local"}
    if platform == "dlc":
        from tests.conftest import dlc_section

        service = dlc_section(request.getfixturevalue("dlc_emulator"))
    service.update(platformConcurrency=cap, platformConcurrencyName=f"cap-test-{platform}")
    # 3 s trials: a slot runs its trial longer than a busy machine takes to start the next one, so two
    # slots in use show as two trials running at once (0.5 s trials missed each other on a loaded CI)
    trial = TRIAL.replace("time.sleep(0.5)", "time.sleep(3)")
    configs = [_config(tmp_path, f"cap{i}", trial, maxTrialNumber=4, trialConcurrency=3, searchSpace=space,
                       tuner={"name": "GridSearch"}, trainingService=service) for i in range(2)]
    procs = [server.spawn(["trialflow", "create", "--config", str(c), "--foreground"], tmp_path / f"cap{i}.log",
                          TRIALFLOW_HOME=str(tmp_path / "home")) for i, c in enumerate(configs)]
    for i, proc in enumerate(procs):
        assert proc.wait(timeout=300) == 0, (tmp_path / f"cap{i}.log").read_text()[-3000:]
    intervals = []
    for i in range(2):
        exp = _experiment(tmp_path, f"cap{i}")
        assert exp.record.status == "DONE"
        trials = open_store(tmp_path / "w", exp.record.id).trials()
        assert [t.status for t in trials] == ["SUCCEEDED"] * 4
        intervals += [(t.start_time, t.end_time) for t in trials]
    edges = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda p: (p[0], p[1]))
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    assert peak <= cap  # never more than the cap (6 trials wanted at once) ...
    assert peak >= (cap if platform == "local" else 2)  # ... and its slots were shared (jobs start more slowly)
    assert client.read_global_concurrency_limit_by_name(f"cap-test-{platform}").limit == cap


def test_experiments_creating_one_platform_cap_together_all_start(server):
    """Two experiments starting at once both find no limit and both create it: neither may fail."""
    from concurrent.futures import ThreadPoolExecutor

    from prefect.settings import PREFECT_API_URL, temporary_settings

    from trialflow.server.limits import PlatformCap

    with temporary_settings(updates={PREFECT_API_URL: server.url}):
        for attempt in range(5):
            caps = [PlatformCap(f"cap-race-{attempt}", 3) for _ in range(8)]
            with ThreadPoolExecutor(8) as pool:
                started = list(pool.map(lambda cap: cap.ensure(), caps))
            assert len(started) == 8
            for cap in caps:
                cap.close()


def test_a_cap_an_operator_changed_in_prefect_is_kept_and_the_difference_said(server, client, caplog):
    import logging

    from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from trialflow.server.limits import PlatformCap

    with temporary_settings(updates={PREFECT_API_URL: server.url}):
        PlatformCap("cap-operator", 3).ensure().close()  # made by the first experiment
        assert client.read_global_concurrency_limit_by_name("cap-operator").limit == 3
        client.update_global_concurrency_limit("cap-operator", GlobalConcurrencyLimitUpdate(limit=1))
        with caplog.at_level(logging.WARNING, logger="trialflow.limits"):
            PlatformCap("cap-operator", 3).ensure().close()  # the next experiment's start
    assert client.read_global_concurrency_limit_by_name("cap-operator").limit == 1
    assert "platformConcurrency is 3 but Prefect's global concurrency limit 'cap-operator' has 1 slots" in caplog.text


def test_block_register_puts_every_platform_block_in_the_catalog(server, client, tmp_path):
    run = subprocess.run(["prefect", "block", "register", "-m", "trialflow.blocks"], env=server.env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    slugs = {b.slug for b in client.read_block_types()}
    assert {"trialflow-ssh-credentials", "trialflow-kubernetes-credentials", "trialflow-openpai-credentials",
            "trialflow-dlts-credentials", "trialflow-azure-ml-credentials", "trialflow-pai-dlc-credentials",
            "trialflow-mlflow-credentials"} <= slugs
    dlc = client.read_block_type_by_slug("trialflow-pai-dlc-credentials")
    schema = next(s for s in client.read_block_schemas() if s.block_type_id == dlc.id)
    assert schema.fields["properties"]["access_key_secret"]["format"] == "password"  # a SecretStr in the UI


def _deploy(server: PrefectServer, prefect_file: Path) -> None:
    run = subprocess.run(["prefect", "--no-prompt", "deploy", "--all", "--prefect-file", str(prefect_file)],
                         env=server.env, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stdout + run.stderr


def _flow_run_of(client, deployment: str, timeout: float = 240.0):
    found: list = []

    def done() -> bool:
        dep = client.read_deployment_by_name(deployment)
        runs = [r for r in client.read_flow_runs() if r.deployment_id == dep.id and r.state and r.state.is_final()]
        found[:] = runs
        return bool(runs)

    wait_for(done, timeout=timeout, interval=2.0)
    return found[0]


def _run_deployment(server: PrefectServer, client, deployment: str, *params: str, timeout: float = 240.0):
    """``prefect deployment run`` as a user types it; the flow run once it is final."""
    args = [a for p in params for a in ("--param", p)]
    run = subprocess.run(["prefect", "deployment", "run", deployment, *args], env=server.env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    run_id = run.stdout.split("UUID:")[1].split()[0]
    return wait_for(lambda: (r := client.read_flow_run(run_id)).state and r.state.is_final() and r,
                    timeout=timeout, interval=1.0)


def _first_run_of(client, deployment: str, left, timeout: float = 240.0):
    """The first flow run of ``deployment`` that ``left`` (a predicate on its state) accepts."""
    def found():
        dep = client.read_deployment_by_name(deployment)
        return next((r for r in client.read_flow_runs() if r.deployment_id == dep.id and r.state and left(r.state)),
                    None)
    return wait_for(found, timeout=timeout, interval=1.0)


def test_work_pool_deployment_nightly_schedule_and_cancel(server, client, tmp_path):
    subprocess.run(["prefect", "work-pool", "create", "local", "--type", "process"], env=server.env, check=True,
                   capture_output=True, timeout=120)
    # the file's deployments, and the nightly sweep again with a near-term cron: its first run comes at the
    # next minute, while the quickstart runs
    spec = yaml.safe_load((REPO / "deployments" / "prefect.yaml").read_text())
    file_schedule = next(d for d in spec["deployments"] if d["name"] == "nightly-sweep")["schedules"][0]
    soon = {**next(d for d in spec["deployments"] if d["name"] == "nightly-sweep"), "name": "nightly-soon",
            "schedules": [{"cron": "* * * * *", "timezone": "UTC", "active": True}],
            "parameters": {"config_path": str(_config(tmp_path, "soon", maxTrialNumber=2,
                                                      searchSpace={"x": {"_type": "choice", "_value": [1]}}))}}
    with_soon = tmp_path / "prefect-soon.yaml"
    with_soon.write_text(yaml.safe_dump({**spec, "deployments": [*spec["deployments"], soon]}))
    _deploy(server, with_soon)
    nightly = client.read_deployment_by_name("experiment/nightly-sweep")
    assert nightly.schedules[0].schedule.cron == file_schedule["cron"]
    assert nightly.schedules[0].schedule.timezone == file_schedule["timezone"]
    assert "trialflow" in nightly.tags  # its runs carry the tag from their creation

    home = tmp_path / "home"
    worker = server.spawn(["prefect", "worker", "start", "--pool", "local"], tmp_path / "worker.log",
                          TRIALFLOW_PROJECT_DIR=str(REPO), TRIALFLOW_HOME=str(home),
                          PREFECT_LOGGING_LEVEL="INFO")  # its cancellation manager's lines, read below
    worker_log = lambda: (tmp_path / "worker.log").read_text()[-3000:]  # noqa: E731
    try:
        # the work-pool path of the file, as a user runs it
        run = subprocess.run(["prefect", "deployment", "run", "experiment/quickstart"], env=server.env,
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stdout + run.stderr
        finished = _flow_run_of(client, "experiment/quickstart", timeout=400)
        assert finished.state.type.value == "COMPLETED", worker_log()
        assert "trialflow" in finished.tags
        quick = [e for e in list_experiments(home) if e.record.name == "quickstart"]
        assert [e.record.status for e in quick] == ["DONE"]

        # the scheduler created the near-term cron's run and the worker took it; later ones are not wanted
        _first_run_of(client, "experiment/nightly-soon", lambda state: not state.is_scheduled())
        client.pause_deployment(client.read_deployment_by_name("experiment/nightly-soon").id)
        fired = _flow_run_of(client, "experiment/nightly-soon", timeout=240)
        assert fired.state.type.value == "COMPLETED" and fired.auto_scheduled, worker_log()
        assert _experiment(tmp_path, "soon").record.status == "DONE"

        # a stored experiment run through a deployment whose default config_path is another experiment's
        soon_exp = _experiment(tmp_path, "soon").record
        refused = _run_deployment(server, client, "experiment/quickstart", f"experiment_id={soon_exp.id}")
        assert refused.state.type.value == "FAILED"
        assert "describes another experiment" in refused.state.message and "maxTrialNumber" in refused.state.message
        assert [e.record.name for e in list_experiments(home)] == ["quickstart"]  # nothing was created either
        again = _run_deployment(server, client, "experiment/quickstart", f"experiment_id={soon_exp.id}",
                                "config_path=null")
        assert again.state.type.value == "COMPLETED", again.state.message
        assert open_store(tmp_path / "w", soon_exp.id).count_trials() == 2  # its own budget, nothing added

        # a flow run cancelled from the API stops the experiment and its trials
        long = _config(tmp_path, "long", maxTrialNumber=2, trialConcurrency=2,
                       searchSpace={"x": {"_type": "choice", "_value": [3]}})
        run = subprocess.run(["prefect", "deployment", "run", "experiment/quickstart", "--param",
                              f"config_path={long}"], env=server.env, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stdout + run.stderr
        store_of = lambda: open_store(tmp_path / "w", _experiment(tmp_path, "long").record.id)  # noqa: E731
        wait_for(lambda: any(e.record.name == "long" for e in list_experiments(tmp_path / "w"))
                 and [t.status for t in store_of().trials()].count("RUNNING") == 2, timeout=180, interval=1.0)
        flow_run = next(r for r in client.read_flow_runs() if r.parameters.get("config_path") == str(long))
        subprocess.run(["prefect", "flow-run", "cancel", str(flow_run.id)], env=server.env, check=True,
                       capture_output=True, timeout=120)
        wait_for(lambda: _experiment(tmp_path, "long").record.status == "STOPPED", timeout=180, interval=1.0)
        trials = store_of().trials()
        assert [t.status for t in trials] == ["USER_CANCELED", "USER_CANCELED"]
        for trial in trials:
            pid = json.loads((Path(trial.log_dir) / ".nni" / "keeper.pid").read_text())["pid"]
            assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
        long_id = _experiment(tmp_path, "long").record.id
        cancelled = wait_for(lambda: (r := client.read_flow_run(flow_run.id)).state.is_final() and r, timeout=60)
        assert cancelled.state.type.value == "CANCELLED" and cancelled.name == long_id
        assert {"trialflow", long_id, "local"} <= set(cancelled.tags)

        # the UI's Retry of the cancelled run (what its button sends) resumes that experiment: nothing new.
        # Clicked with the worker that ran it gone: a worker reports a run's killed process (Crashed, exit
        # -15) after its "Cancelled flow run" line, and a Retry before that report lets it end the retried
        # run (r43, CI of f6af7c5); its executed-flow-run event, the last thing it does for a run, did not
        # come in 120 s once (r2 of the stop after e5c6d8d). A stopped worker reports nothing more, so the
        # Retry follows its exit and a new worker takes the retried run.
        from prefect.states import Scheduled

        stop_group(worker)
        worker = server.spawn(["prefect", "worker", "start", "--pool", "local"], tmp_path / "worker2.log",
                              TRIALFLOW_PROJECT_DIR=str(REPO), TRIALFLOW_HOME=str(home), PREFECT_LOGGING_LEVEL="INFO")
        worker_log = lambda: (tmp_path / "worker2.log").read_text()[-3000:]  # noqa: E731
        retry = client.set_flow_run_state(flow_run.id, Scheduled(name="AwaitingRetry", message="Retry from the UI"),
                                          force=True)
        try:
            retried = wait_for(lambda: (r := client.read_flow_run(flow_run.id)).state.id != retry.state.id
                               and r.state.is_final() and r, timeout=300, interval=1.0)
        except AssertionError:
            now = client.read_flow_run(flow_run.id)
            raise AssertionError(f"the retried run is {now.state.type.value} ({now.state.name}: "
                                 f"{now.state.message}), run count {now.run_count}; worker log:\n{worker_log()}"
                                 ) from None
        assert retried.run_count > 1, (retried.state.name, retried.state.message, worker_log())
        assert [e.record.id for e in list_experiments(tmp_path / "w") if e.record.name == "long"] == [long_id]
        assert [t.status for t in store_of().trials()] == ["USER_CANCELED", "USER_CANCELED"]  # nothing re-run
        assert retried.name == long_id
    finally:
        stop_group(worker)


LAUNCH = {
    "background": ["-m", "trialflow.cli", "create", "--config", "{config}"],
    "foreground": ["-m", "trialflow.cli", "create", "--config", "{config}", "--foreground"],
    "notebook": ["-c", "import sys, trialflow; trialflow.run_experiment(sys.argv[1])", "{config}"],
}


@pytest.mark.parametrize("launch,stop_with", [("background", "cancel"), ("foreground", "cancel"),
                                              ("notebook", "cancel"), ("background", "trialflow stop")])
def test_cancelling_the_flow_run_stops_the_experiment_in_every_launch_mode(server, client, tmp_path, launch,
                                                                          stop_with):
    """No worker watches these runs: the experiment itself notices its run Cancelling. Every way of
    stopping leaves the run final, named by the experiment id and tagged for the UI's filters."""
    config = _config(tmp_path, "held", maxTrialNumber=4, trialConcurrency=2,
                     searchSpace={"x": {"_type": "choice", "_value": [3]}})
    args = [sys.executable, *[a.format(config=config) for a in LAUNCH[launch]]]
    proc = server.spawn(args, tmp_path / "launch.log", TRIALFLOW_HOME=str(tmp_path / "home"))
    try:
        wait_for(lambda: any(e.record.name == "held" for e in list_experiments(tmp_path / "w")), timeout=120)
        record = _experiment(tmp_path, "held").record
        store = open_store(tmp_path / "w", record.id)
        wait_for(lambda: len(store.trials(["RUNNING"])) == 2 and store.experiment().flow_run_id, timeout=120)
        run_id = store.experiment().flow_run_id
        run = client.read_flow_run(run_id)
        assert run.name == record.id
        assert {"trialflow", record.id, "local", "Random"} <= set(run.tags)
        if stop_with == "cancel":
            subprocess.run(["prefect", "flow-run", "cancel", run_id], env=server.env, check=True,
                           capture_output=True, timeout=120)
        else:
            subprocess.run([sys.executable, "-m", "trialflow.cli", "stop", record.id, "--root", str(tmp_path / "w")],
                           env=server.env, check=True, capture_output=True, timeout=120)
        asked = time.monotonic()  # the experiment's own reaction (a CLI's start takes seconds on a busy machine)
        wait_for(lambda: store.experiment().status == "STOPPED", timeout=30, interval=0.2)
        assert time.monotonic() - asked < 10
        assert [t.status for t in store.trials()] == ["USER_CANCELED", "USER_CANCELED"]  # none started after
        final = wait_for(lambda: (r := client.read_flow_run(run_id)).state.is_final() and r, timeout=30)
        assert final.state.type.value == "CANCELLED", final.state
        assert final.end_time is not None
        proc.wait(timeout=60)
    finally:
        stop_group(proc)


def test_stop_after_a_killed_controller_leaves_its_flow_run_cancelled(server, client, tmp_path):
    from tests.conftest import run_until_running_then_sigkill
    from trialflow.config import load_config

    path = _config(tmp_path, "k", maxTrialNumber=2, trialConcurrency=2,
                   searchSpace={"x": {"_type": "choice", "_value": [3]}})
    exp_id, _, store = run_until_running_then_sigkill(load_config(path), server.url, config_path=str(path))
    run_id = store.experiment().flow_run_id
    assert client.read_flow_run(run_id).state.type.value == "RUNNING"  # nobody left to end it
    stop = subprocess.run([sys.executable, "-m", "trialflow.cli", "stop", exp_id, "--root", str(tmp_path / "w")],
                          env=server.env, capture_output=True, text=True, timeout=120)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert store.experiment().status == "STOPPED"
    final = client.read_flow_run(run_id)
    assert final.state.type.value == "CANCELLED" and final.end_time is not None
