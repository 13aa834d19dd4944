"""Experiments logged to Weights & Biases: offline runs written by W&B's own client under the experiment's
folder and read back with W&B's own reader of its run files (one run per trial, grouped by the experiment,
with parameters, intermediate results as steps, final results, status and output; one run for the
experiment naming the best trial); a resume that logs nothing twice; an online W&B that refuses the key."""

from __future__ import annotations

import base64
import http.server
import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import base_config, write_trial
from tests.test_cli import cli
from tests.test_tracking import _workers, trial_body
from trialflow import run_experiment
from trialflow.experiments import open_store

pytestmark = pytest.mark.usefixtures("prefect_server")


def _config(tmp_path: Path, values=(1, 2, 9), **overrides) -> dict:
    body = trial_body(tmp_path)
    write_trial(tmp_path / "code", body)
    space = {"x": {"_type": "choice", "_value": list(values)}}
    settings = {"maxTrialNumber": len(values), "trialConcurrency": 2,
                "tracking": {"wandb": {"project": f"sweep-{uuid.uuid4().hex[:8]}"}}, **overrides}
    return base_config(tmp_path / "code", tmp_path / "w", searchSpace=space, tuner={"name": "GridSearch"},
                       **settings)


def _read_run(path: Path) -> dict[str, Any]:
    """A run's ``.wandb`` file as W&B's reader gives it: the run record, history rows by step,
    the summary, the files saved and the exit code (None when the run never ended)."""
    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal import datastore

    store = datastore.DataStore()
    store.open_for_scan(str(path))
    run: dict[str, Any] = {"history": {}, "summary": {}, "files": set(), "exit_code": None}
    while (data := store.scan_data()) is not None:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run["run"] = record.run
            run["config"] = {i.key: json.loads(i.value_json) for i in record.run.config.update if i.key != "_wandb"}
        elif kind == "history":
            row = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item}
            run["history"][row.pop("_step")] = {k: v for k, v in row.items() if not k.startswith("_")}
        elif kind == "summary":
            run["summary"].update({"/".join(i.nested_key) or i.key: json.loads(i.value_json)
                                   for i in record.summary.update})
        elif kind == "files":
            run["files"] |= {f.path for f in record.files.files}
        elif kind == "exit":
            run["exit_code"] = record.exit.exit_code
    return run


def _runs(exp_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """The W&B runs under the experiment's folder by run id (a list: one per folder written)."""
    found: dict[str, list[dict[str, Any]]] = {}
    for path in sorted((exp_dir / "wandb" / "wandb").glob("*run-*/run-*.wandb")):
        run = _read_run(path)
        found.setdefault(run["run"].run_id, []).append({**run, "folder": path.parent})
    return found


def _check_trial_runs(exp_dir: Path, experiment_id: str, trials: list) -> dict[str, Any]:
    """One ended run per trial, with what the record holds; returns the experiment's own run."""
    runs = _runs(exp_dir)
    assert sorted(runs) == sorted([experiment_id] + [f"{experiment_id}-{t.id}" for t in trials])
    assert all(len(found) == 1 for found in runs.values()), {k: len(v) for k, v in runs.items()}
    for trial in trials:
        [run] = runs[f"{experiment_id}-{trial.id}"]
        record = run["run"]
        assert (record.run_group, record.job_type, record.display_name) == (experiment_id, "trial", trial.id)
        assert run["config"] == {"x": trial.parameters["x"]} and list(record.tags) == [trial.status]
        assert {step: row["intermediate/default"] for step, row in run["history"].items()} == {
            i: trial.parameters["x"] + i for i in range(3)}
        assert [round(row["intermediate/loss"], 6) for row in run["history"].values()] == [1.0, 0.5, 0.333333]
        summary = run["summary"]
        assert summary["trialflow.status"] == trial.status and summary["trialflow.end_time"] == trial.end_time
        if trial.status == "SUCCEEDED":
            assert summary["default"] == trial.parameters["x"] * 10 and run["exit_code"] == 0
        else:
            assert "default" not in summary and summary["trialflow.exit_code"] == 3 and run["exit_code"] == 1
        assert {"logs/trial.stdout", "logs/trial.stderr"} <= run["files"]
        stdout = run["folder"] / "files" / "logs" / "trial.stdout"
        assert f"trial says {trial.parameters['x']}" in stdout.read_text()
    [experiment] = runs[experiment_id]
    assert experiment["run"].job_type == "experiment" and experiment["exit_code"] == 0
    return experiment


def test_an_experiment_is_a_wandb_run_per_trial_grouped_with_a_run_of_its_own(tmp_path):
    config = _config(tmp_path)
    result = run_experiment(config)
    assert result.status == "DONE" and len(result.trials) == 3
    exp_dir = tmp_path / "w" / result.experiment_id
    experiment = _check_trial_runs(exp_dir, result.experiment_id, result.trials)
    assert experiment["run"].project == config["tracking"]["wandb"]["project"]
    assert experiment["config"]["trialflow"]["trialCommand"] == config["trialCommand"]
    assert experiment["summary"]["trialflow.best_trial"] == result.best.id
    assert experiment["summary"]["trialflow.status"] == "DONE"
    assert experiment["summary"]["trialflow.platform"] == "local" and list(experiment["run"].tags) == [
        "DONE", "GridSearch"]
    assert _workers() == []


def test_a_resume_logs_to_wandb_what_is_new_and_what_was_cut_off_and_nothing_twice(tmp_path):
    config = _config(tmp_path, values=(1, 2, 3, 4), maxTrialNumber=2)
    first = run_experiment(config)
    exp_dir = tmp_path / "w" / first.experiment_id
    assert len(_runs(exp_dir)) == 3
    # what a worker killed while logging a trial leaves: its run's folder, the trial not in the ledger
    cut = next(t for t in first.trials if t.id != first.best.id)
    ledger = exp_dir / "wandb" / "logged-trials"
    ledger.write_text("".join(f"{t}\n" for t in ledger.read_text().split() if t != cut.id))
    more = cli("resume", first.experiment_id, "--trialnum", "4", "--foreground", "--root", str(tmp_path / "w"))
    assert more.returncode == 0, more.stdout + more.stderr
    trials = open_store(tmp_path / "w", first.experiment_id).trials()
    assert len(trials) == 4
    experiment = _check_trial_runs(exp_dir, first.experiment_id, trials)  # the cut-off one logged again, once
    best = max((t for t in trials if t.status == "SUCCEEDED"), key=lambda t: t.final)
    assert experiment["summary"]["trialflow.best_trial"] == best.id
    assert sorted(ledger.read_text().split()) == sorted(t.id for t in trials)


class _RefusingWandb(http.server.BaseHTTPRequestHandler):
    """A W&B server that refuses every key; it keeps the Authorization headers it was sent."""

    seen: list[str]

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.seen.append(self.headers.get("authorization") or "")
        self.send_response(401)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"errors": [{"message": "permission denied"}]}')

    do_GET = do_POST

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def refusing_wandb(block: str) -> Iterator[tuple[str, list[str]]]:
    """A loopback W&B server that refuses every key, and a WandbCredentials block named ``block``
    holding a fresh key and that server; yields the key and the Authorization headers it received."""
    from trialflow.blocks import WandbCredentials

    handler = type("Handler", (_RefusingWandb,), {"seen": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    key = f"local-{uuid.uuid4().hex}{uuid.uuid4().hex[:8]}"
    WandbCredentials(api_key=key, base_url=f"http://127.0.0.1:{server.server_port}").save(block, overwrite=True)
    try:
        yield key, handler.seen
    finally:
        server.shutdown()
        server.server_close()


def key_was_sent(key: str, headers: list[str]) -> bool:
    """Whether W&B's client sent ``key`` (HTTP basic authentication) in one of ``headers``."""
    return any(base64.b64decode(h.split()[-1]).decode().endswith(key) for h in headers if h.startswith("Basic "))


def test_an_online_wandb_that_refuses_the_key_never_fails_the_experiment(tmp_path):
    name = f"wandb-{uuid.uuid4().hex[:8]}"
    config = _config(tmp_path, values=(1, 2))
    config["tracking"]["wandb"].update(mode="online", credentials=name)
    with refusing_wandb(name) as (key, seen):
        result = run_experiment(config)
    assert result.status == "DONE" and [t.status for t in result.trials] == ["SUCCEEDED", "SUCCEEDED"]
    assert key_was_sent(key, seen)
    exp_dir = tmp_path / "w" / result.experiment_id
    log = (exp_dir / "log" / "experiment.log").read_text()
    assert log.count("cannot log this experiment now") == 1 and "401" in log and "Traceback" not in log, log
    assert not (exp_dir / "wandb" / "logged-trials").exists() and _workers() == []
