"""Prefect integration: UI artifacts and `prefect deployment run` against a local Prefect server."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import time

import pytest
import yaml

from tests.conftest import base_config, write_trial
from trialflow import resume_experiment, run_experiment
from trialflow.experiments import list_experiments
from trialflow.records.store import Control
from trialflow.testing.prefect_server import stop_group

pytestmark = pytest.mark.usefixtures("prefect_server")


def test_progress_table_and_best_trial_artifacts(tmp_path):
    from prefect.artifacts import Artifact

    code = tmp_path / "code"
    write_trial(code, "import nni\np = nni.get_next_parameter()\nnni.report_final_result(p['x'])\n")
    result = run_experiment(base_config(code, tmp_path / "w", maxTrialNumber=3))
    key = f"experiment-{result.experiment_id}"
    table = Artifact.get(f"{key}-trials")
    rows = json.loads(table.data) if isinstance(table.data, str) else table.data
    assert sorted(r["trial"] for r in rows) == sorted(t.id for t in result.trials)
    assert all(r["status"] == "SUCCEEDED" and r["param.x"] == r["metric"] for r in rows)
    best = Artifact.get(f"{key}-best")
    assert result.best.id in best.data
    assert "metric direction: **maximize**" in best.data and "finished: 3" in best.data  # no optimize_mode
    assert best.description == "best trial of the run" and "has ended" in best.data  # not "so far" at the end
    progress = Artifact.get(f"{key}-progress")
    assert float(progress.data) == 100.0


def test_the_progress_bar_counts_against_the_budget_a_resume_gave(tmp_path):
    """`resume --trialnum` (and `update trialnum`) replace maxTrialNumber: the bar reads trials finished
    out of that, here 3 of 5 when the grid ran out, not 3 of the config's 2."""
    from prefect.artifacts import Artifact

    code = tmp_path / "code"
    write_trial(code, "import nni\np = nni.get_next_parameter()\nnni.report_final_result(p['x'])\n")
    config = base_config(code, tmp_path / "w", maxTrialNumber=2, trialConcurrency=1,
                         searchSpace={"x": {"_type": "choice", "_value": [1, 2, 3]}}, tuner={"name": "GridSearch"})
    first = run_experiment(config)
    key = f"experiment-{first.experiment_id}-progress"
    assert float(Artifact.get(key).data) == 100.0
    result = resume_experiment(first.experiment_id, tmp_path / "w", max_trial_number=5)
    assert result.status == "DONE" and len(result.trials) == 3
    assert float(Artifact.get(key).data) == 60.0


def test_artifact_versions_are_written_only_on_change_and_at_most_every_snapshot_interval(tmp_path, monkeypatch):
    """The progress bar is one artifact updated in place; the table and the summary get a new version
    at most every SNAPSHOT_INTERVAL (here 1.5 s instead of 5 minutes) and at the end, and none when
    nothing changed: the 8-hour bound of ~200 versions, in miniature."""
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from trialflow.flows import api_outage
    from trialflow.flows import artifacts as ui

    monkeypatch.setattr(ui, "PROGRESS_INTERVAL", 0.1)
    monkeypatch.setattr(ui, "SNAPSHOT_INTERVAL", 1.5)
    # after a slow call the next waits API_SHARE (20) times as long: on a loaded machine one slow first
    # write deferred every later one past this 5-second run's end, leaving only the final version
    monkeypatch.setattr(api_outage, "API_SHARE", 1)
    code = tmp_path / "code"
    write_trial(code, "import nni, time\np = nni.get_next_parameter()\ntime.sleep(0.3)\n"
                "nni.report_final_result(p['x'])\n")
    started = time.monotonic()
    result = run_experiment(base_config(code, tmp_path / "w", maxTrialNumber=12, trialConcurrency=2))
    elapsed = time.monotonic() - started
    key = f"experiment-{result.experiment_id}"
    with get_client(sync_client=True) as client:
        def versions(name: str) -> list:
            return client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[f"{key}-{name}"])))

        progress, table, best = versions("progress"), versions("trials"), versions("best")
    assert len(progress) == 1 and float(progress[0].data) == 100.0  # updated in place, never a new version
    bound = int(elapsed / 1.5) + 2  # one per interval, the first after the first trial, one at the end
    assert 2 <= len(table) <= bound, (len(table), elapsed)
    # the summary only when it changed -- and at the end, which it says even when the table's last
    # periodic version already held every trial's end
    assert 1 <= len(best) <= len(table) + 1
    latest = max(table, key=lambda a: a.created)
    rows = json.loads(latest.data) if isinstance(latest.data, str) else latest.data
    assert len(rows) == 12  # the final version is the whole experiment


def test_a_serving_dashboard_is_linked_from_the_experiments_artifacts(tmp_path):
    from prefect.artifacts import Artifact

    from trialflow import parse_config
    from trialflow.experiments import create_experiment, open_store
    from trialflow.flows.experiment import experiment_flow

    code = tmp_path / "code"
    write_trial(code, "import nni\np = nni.get_next_parameter()\nnni.report_final_result(p['x'])\n")
    exp_id, exp_dir = create_experiment(parse_config(base_config(code, tmp_path / "w", maxTrialNumber=2)))
    url = "http://127.0.0.1:8080/dashboard/studies/0"
    open_store(exp_dir.parent, exp_id).set_control(Control.DASHBOARD_URL, url)  # as a serving dashboard does
    assert experiment_flow(None, exp_id, str(exp_dir.parent)) == "DONE"
    link = Artifact.get(f"experiment-{exp_id}-dashboard")
    assert link is not None and link.type == "markdown" and url in link.data


@pytest.mark.timeout(600)
def test_prefect_deployment_run_starts_an_experiment(tmp_path, prefect_server):
    from tests.conftest import wait_for

    code = tmp_path / "code"
    write_trial(code, "import nni\np = nni.get_next_parameter()\nnni.report_final_result(p['x'])\n")
    config = tmp_path / "config.yml"
    config.write_text(yaml.safe_dump(base_config(code, tmp_path / "w", maxTrialNumber=2, experimentName="dep")))
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "PREFECT_RUNNER_POLL_FREQUENCY": "1",
           "PREFECT_LOGGING_LEVEL": "INFO",  # its runs' lines in its log, as a worker's
           "TMPDIR": str(tmp_path)}  # the runner's storage folder in here, not in the machine's
    serve_code = ("from trialflow.flows.experiment import experiment_flow\n"
                  f"experiment_flow.serve(name='nightly-test', parameters={{'config_path': {str(config)!r}}})\n")
    serve_log = tmp_path / "serve.log"
    server = subprocess.Popen([sys.executable, "-c", serve_code], env=env, start_new_session=True,
                              stdout=open(serve_log, "wb"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240  # generous: the session's API server may still be busy
        while True:  # the deployment appears once serve has registered it
            run = subprocess.run(["prefect", "deployment", "run", "experiment/nightly-test"], env=env,
                                 capture_output=True, text=True, timeout=120)
            if run.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert run.returncode == 0, run.stdout + run.stderr
        found = None
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and found is None:
            done = [e for e in list_experiments(tmp_path / "w") if e.record.status == "DONE"]
            found = done[0] if done else None
            time.sleep(1)
        if found is None:  # say why: the flow run's state, the runner's log, the experiments' states
            runs = subprocess.run(["prefect", "flow-run", "ls"], env=env, capture_output=True, text=True,
                                  timeout=120)
            states = [(e.record.name, e.record.status) for e in list_experiments(tmp_path / "w")]
            pytest.fail(f"the deployment run did not finish an experiment: experiments {states}\n"
                        f"{runs.stdout}\nrunner log:\n{serve_log.read_text(errors='replace')[-4000:]}")
        assert found.record.name == "dep"
        # the run is named after its new experiment from its first line on, as a worker's log shows
        beginning = f"Beginning flow run '{found.id}' for flow 'experiment'"
        wait_for(lambda: beginning in serve_log.read_text(errors="replace"), timeout=30)
        assert "new-" not in serve_log.read_text(errors="replace")
    finally:
        stop_group(server, grace=40)


def test_deployments_file_is_valid():
    from prefect.flows import load_flow_from_entrypoint

    spec = yaml.safe_load(open("deployments/prefect.yaml"))
    names = {d["name"] for d in spec["deployments"]}
    assert {"quickstart", "nightly-sweep"} <= names
    for dep in spec["deployments"]:
        assert load_flow_from_entrypoint(dep["entrypoint"]).name == "experiment"
        assert os.path.isfile(dep["parameters"]["config_path"])
    nightly = next(d for d in spec["deployments"] if d["name"] == "nightly-sweep")
    assert nightly["schedules"][0]["cron"] == "0 2 * * *"


def test_a_runs_first_state_events_carry_its_tags_so_tag_automations_match(tmp_path):
    """Prefect relates a run's tags to its state events from the run as created (and caches them): a
    run tagged only once it started would send Pending and Running with no tag, and an automation on
    ``prefect.tag.trialflow`` would miss a short sweep."""
    from prefect import get_client
    from prefect.events.filters import EventFilter, EventResourceFilter

    from tests.conftest import wait_for
    from trialflow.experiments import open_store

    code = tmp_path / "code"
    write_trial(code, "import nni\np = nni.get_next_parameter()\nnni.report_final_result(p['x'])\n")
    result = run_experiment(base_config(code, tmp_path / "w", maxTrialNumber=1, experimentName="multi-a"))
    run_id = open_store(tmp_path / "w", result.experiment_id).experiment().flow_run_id
    wanted = {"Pending", "Running", "Completed"}

    def state_events():
        with get_client(sync_client=True) as client:
            page = client.read_events(EventFilter(resource=EventResourceFilter(id=[f"prefect.flow-run.{run_id}"])),
                                       limit=50)
        found = {e.event.rpartition(".")[2]: e for e in page.events if e.event.startswith("prefect.flow-run.")}
        return found if wanted <= set(found) else None

    events = wait_for(state_events, timeout=60, interval=0.5)
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    def task_runs():  # written by the server's task-run recorder from events, a flush after they arrive
        with get_client(sync_client=True) as client:
            return client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))

    recorded = wait_for(task_runs, timeout=60, interval=0.5)  # its task runs take no tag concurrency lease: untagged
    assert all(not t.tags for t in recorded), [(t.name, t.tags) for t in recorded]
    for name in wanted:
        tags = {r.id for r in events[name].related if r.role == "tag"}
        assert {"prefect.tag.trialflow", f"prefect.tag.{result.experiment_id}", "prefect.tag.local",
                "prefect.tag.Random", "prefect.tag.name:multi-a"} <= tags, (name, tags)


def test_a_deployment_runs_overrides_change_a_new_experiments_config_as_validated_as_the_file(tmp_path):
    """`prefect deployment run experiment/quickstart -p overrides='{"trialConcurrency": 1}'` (or the UI's
    custom run form, whose fields come from the flow's parameters) changes the run's config; a bad value
    is refused as in a file, one line per mistake, under a heading that names the overrides."""
    from trialflow.config import ConfigError
    from trialflow.experiments import open_store
    from trialflow.flows.experiment import experiment_flow
    from trialflow.records.store import Control

    assert "overrides" in experiment_flow.parameters.properties  # a field of the UI's custom run form
    code = tmp_path / "code"
    write_trial(code, "import nni\np = nni.get_next_parameter()\nnni.report_final_result(p['x'])\n")
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(base_config(code, tmp_path / "w", maxTrialNumber=5)))
    overrides = {"maxTrialNumber": 2, "trialConcurrency": 1, "tuner": {"classArgs": {"seed": 3}}}
    assert experiment_flow(str(path), overrides=overrides) == "DONE"
    (entry,) = list_experiments(tmp_path / "w")
    stored = entry.record.config
    assert (stored["maxTrialNumber"], stored["trialConcurrency"]) == (2, 1)
    assert stored["tuner"] == {"name": "Random", "classArgs": {"seed": 3}}  # merged into the file's tuner
    store = open_store(tmp_path / "w", entry.id)
    assert len(store.trials()) == 2 and set(store.controls()[Control.CHANGED_FIELDS]) == set(overrides)
    store.close()
    with pytest.raises(ConfigError) as bad:
        experiment_flow(str(path), overrides={"trialConcurrency": 0})
    heading, *mistakes = str(bad.value).splitlines()
    assert 'with overrides {"trialConcurrency": 0}' in heading
    assert mistakes == ["  - trialConcurrency: Input should be greater than 0 (got 0)"]
    assert len(list_experiments(tmp_path / "w")) == 1  # nothing created
    with pytest.raises(ValueError, match="overrides apply to a new experiment"):
        experiment_flow(str(path), experiment_id=entry.id, overrides={"trialConcurrency": 2})


class _Hooks(http.server.BaseHTTPRequestHandler):
    """A webhook receiver on loopback: keeps the text of every notification posted to it."""

    received: list[str] = []

    def do_POST(self):  # noqa: N802 -- http.server's name
        self.received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"])))["text"])
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_the_readmes_automation_notifies_of_each_new_best_and_a_failed_sweep_of_its_tag_only(tmp_path):
    """examples/automations/notify_sweep.py, run as the README says, makes the Prefect server send a
    notification (through a webhook block, to a receiver on loopback) for each of trialflow's own
    ``best-trial`` events and for the ``failed`` event of a sweep with its tag, and none for a sweep with
    another; each trial's end is an event of its own, with its outcome and metric."""
    import threading
    import uuid

    from prefect import get_client
    from prefect.blocks.notifications import CustomWebhookNotificationBlock
    from prefect.events.filters import EventFilter, EventNameFilter, EventRelatedFilter, EventResourceFilter

    from tests.conftest import wait_for
    from trialflow.experiments.results import trial_value

    receiver = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hooks)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    name, block = f"nightly-{uuid.uuid4().hex[:8]}", f"hook-{uuid.uuid4().hex[:8]}"
    CustomWebhookNotificationBlock(name="trialflow test", url=f"http://127.0.0.1:{receiver.server_port}/hook",
                                   json_data={"text": "{{subject}} || {{body}}"}, allow_private_urls=True).save(block)
    made = subprocess.run([sys.executable, "examples/automations/notify_sweep.py", "--block", f"custom-webhook/{block}",
                           "--tag", f"name:{name}"], capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stdout + made.stderr
    try:
        code = tmp_path / "code"
        write_trial(code, "import nni\np = nni.get_next_parameter()\nnni.report_final_result(p['x'])\n")
        found = run_experiment(base_config(code, tmp_path / "w", maxTrialNumber=4, trialConcurrency=1,
                                           experimentName=name))
        other = run_experiment(base_config(code, tmp_path / "w", maxTrialNumber=1, experimentName=f"other-{name}"))
        broken = tmp_path / "broken"
        write_trial(broken, "import sys\nsys.exit('no data at /nonexistent')\n")
        failed = run_experiment(base_config(broken, tmp_path / "w", maxTrialNumber=2, experimentName=name))
        assert failed.status == "DONE" and not failed.best

        values, bests = [trial_value(t) for t in sorted(found.trials, key=lambda t: t.sequence)], []
        for value in values:  # one trial at a time: each ends in sequence
            if not bests or value > bests[-1]:
                bests.append(value)
        notes = wait_for(lambda: _Hooks.received if any("failed" in n for n in _Hooks.received)
                         and sum("best-trial" in n for n in _Hooks.received) >= len(bests) else None, timeout=90)
        assert sorted(float(n.split(", metric ")[1].split(" ")[0]) for n in notes if "best-trial" in n) == bests
        (failure,) = [n for n in notes if "failed" in n]
        assert failure.startswith(f"{name}: trialflow.experiment.failed || experiment {name} DONE: no trial succeeded")
        assert "no data at /nonexistent" in failure and "'FAILED': 2" in failure
        assert not any(f"other-{name}" in n or other.experiment_id in n for n in notes)

        experiment = f"trialflow.experiment.{found.experiment_id}"
        with get_client(sync_client=True) as client:
            page = client.read_events(EventFilter(event=EventNameFilter(prefix=["trialflow."]),
                                                  related=EventRelatedFilter(id=[experiment])), limit=50)
        ends = {e.resource["prefect.resource.name"]: e.payload for e in page.events if e.event.startswith(
            "trialflow.trial.")}
        assert {t: (p["status"], p["metric"]) for t, p in ends.items()} == {
            t.id: ("SUCCEEDED", trial_value(t)) for t in found.trials}
        with get_client(sync_client=True) as client:
            page = client.read_events(EventFilter(event=EventNameFilter(name=["trialflow.experiment.done"]),
                                                  resource=EventResourceFilter(id=[experiment])), limit=50)
        (done,) = page.events
        assert done.payload["counts"] == {"SUCCEEDED": 4} and done.payload["best"]["metric"] == max(values)
    finally:
        receiver.shutdown()
        with get_client(sync_client=True) as client:
            for automation in client.read_automations_by_name(name=f"trialflow name:{name}: failed or new best"):
                client.delete_automation(automation.id)
