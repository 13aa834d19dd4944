"""Experiment store, on the embedded SQLite file and on a real PostgreSQL server: crash safety under
SIGKILL, duplicates, terminal status recorded once, readers beside a writer, experiments sharing one
database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from trialflow.records.store import Control, ExperimentStore, Metric

WRITER = """
import sys, time
from trialflow.records.store import ExperimentStore, Metric
store = ExperimentStore(sys.argv[1], "crashexp")
store.create_experiment("crash", {"a": 1})
i = 0
while True:
    tid = f"t{i:05d}"
    store.add_trial(tid, store.take_sequence(), i, {"x": i}, {"x": 0.5})
    store.set_status(tid, "RUNNING")
    store.add_metrics([Metric(tid, "PERIODICAL", s, {"default": s, "nested": [i, s]}) for s in range(3)])
    store.add_metrics([Metric(tid, "FINAL", 0, float(i))])
    store.set_status(tid, "SUCCEEDED", 0)
    print(tid, flush=True)
    i += 1
"""


OPENER = """
import os, sys, time
from trialflow.records.store import ExperimentStore
while not os.path.exists(sys.argv[2]):  # all start opening together
    time.sleep(0.001)
ExperimentStore(sys.argv[1], "raceexp").close()
"""


def test_processes_opening_a_new_store_at_once_all_open_it(store_url, tmp_path):
    """``create`` makes the store while ``experiment list``, a dashboard or the controller opens it:
    the one that loses the race to create a table is not told the file is damaged."""
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", OPENER, store_url, str(go)], stderr=subprocess.PIPE, text=True)
             for _ in range(6)]
    time.sleep(3)  # the openers have imported and wait for the go
    go.touch()
    errors = [p.communicate(timeout=60)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 6, "\n".join(e for e in errors if e)[-2000:]
    store = ExperimentStore(store_url, "raceexp")
    store.create_experiment("race", {})
    assert store.experiment().name == "race"
    store.close()


def test_sigkill_mid_stream_loses_nothing_committed(store_url):
    proc = subprocess.Popen([sys.executable, "-c", WRITER, store_url], stdout=subprocess.PIPE, text=True)
    confirmed = []
    deadline = time.monotonic() + 60
    while len(confirmed) < 150 and time.monotonic() < deadline:
        confirmed.append(proc.stdout.readline().strip())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    store = ExperimentStore(store_url, "crashexp")
    trials = {t.id: t for t in store.trials()}
    if store_url.startswith("sqlite"):
        assert store.engine.connect().exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"
    for tid in confirmed:  # every trial the writer saw committed is complete
        t = trials[tid]
        assert t.status == "SUCCEEDED" and t.final == float(int(tid[1:]))
        assert [m.value["default"] for m in store.metrics(tid, "PERIODICAL")] == [0, 1, 2]
    for t in trials.values():  # anything after the last confirmed one is a consistent prefix
        assert t.status in ("WAITING", "RUNNING", "SUCCEEDED")
    assert store.experiment().next_sequence >= len(trials)


def test_duplicate_metrics_are_dropped_and_dicts_kept_whole(store_url):
    store = ExperimentStore(store_url, "dupexp01")
    store.create_experiment(None, {})
    store.add_trial("abcde", 0, 0, {}, {})
    store.set_status("abcde", "RUNNING")
    assert store.add_metrics([Metric("abcde", "PERIODICAL", 0, {"default": 1, "x": {"y": [1, 2]}})]) == 1
    assert store.add_metrics([Metric("abcde", "PERIODICAL", 0, 99), Metric("abcde", "PERIODICAL", 1, 2)]) == 1
    assert [m.value for m in store.metrics("abcde")] == [{"default": 1, "x": {"y": [1, 2]}}, 2]
    assert store.add_metrics([Metric("abcde", "FINAL", 0, float("nan"))]) == 1
    assert store.trial("abcde").final == "nan"  # stored as text, never an invalid JSON token


def test_terminal_status_is_recorded_once_with_history(store_url):
    store = ExperimentStore(store_url, "statexp1")
    store.create_experiment(None, {})
    store.add_trial("abcde", 0, 0, {}, {})
    assert store.set_status("abcde", "RUNNING")
    assert store.set_status("abcde", "EARLY_STOPPED", message="assessor")
    assert not store.set_status("abcde", "FAILED", exit_code=137)  # the kill's exit does not override
    t = store.trial("abcde")
    assert (t.status, t.exit_code, t.message) == ("EARLY_STOPPED", None, "assessor")
    assert [s for s, _, _ in store.status_history("abcde")] == ["WAITING", "RUNNING", "EARLY_STOPPED"]
    times = [ts for _, ts, _ in store.status_history("abcde")]
    assert times == sorted(times)


def test_a_second_reader_sees_writes_while_the_writer_is_open(store_url):
    writer = ExperimentStore(store_url, "readexp1")
    writer.create_experiment("r", {"k": 1})
    writer.set_control(Control.TRIAL_CONCURRENCY, 4)
    reader = ExperimentStore(store_url, "readexp1")
    assert reader.experiment().controls == {"trial_concurrency": 4}
    reader.set_control(Control.TRIAL_CONCURRENCY, 5)
    assert writer.experiment().controls["trial_concurrency"] == 5


def test_two_experiments_share_one_database_without_seeing_each_others_trials(store_url):
    first, second = ExperimentStore(store_url, "shareexp1"), ExperimentStore(store_url, "shareexp2")
    for store, n in ((first, 3), (second, 2)):
        store.create_experiment(store.experiment_id, {"n": n})
        for i in range(n):
            tid = f"{store.experiment_id[-1]}t{i}"
            store.add_trial(tid, store.take_sequence(), i, {"x": i}, {})
            store.set_status(tid, "RUNNING")
            store.add_metrics([Metric(tid, "FINAL", 0, float(i))])
            store.set_status(tid, "SUCCEEDED", 0)
        store.set_control(Control.STOP, n == 2)
    assert [t.id for t in first.trials()] == ["1t0", "1t1", "1t2"] and first.count_trials() == 3
    assert [t.id for t in second.trials()] == ["2t0", "2t1"] and second.count_trials() == 2
    assert first.experiment().controls == {"stop": False} and second.experiment().controls == {"stop": True}
    assert {m.trial_id for m in second.metrics()} == {"2t0", "2t1"}


def test_a_store_from_before_the_schema_number_opens_and_a_newer_one_is_refused_in_one_line(store_url):
    import pytest
    import sqlalchemy as sa

    from trialflow.records.store import SCHEMA_VERSION, StoreUnreadable

    store = ExperimentStore(store_url, "schemaexp")
    store.create_experiment("old", {"a": 1})
    store.add_trial("s0", store.take_sequence(), 0, {"x": 1}, {})
    store.close()
    engine = sa.create_engine(store_url)
    with engine.begin() as conn:  # as an earlier trialflow left it: no schema table, no newer column
        conn.exec_driver_sql("DROP TABLE trialflow_schema")
        conn.exec_driver_sql("ALTER TABLE experiments DROP COLUMN prefect_api")
    reopened = ExperimentStore(store_url, "schemaexp")
    assert [t.id for t in reopened.trials()] == ["s0"] and reopened.experiment().prefect_api is None
    reopened.close()
    with engine.begin() as conn:
        assert conn.exec_driver_sql("SELECT version FROM trialflow_schema").scalar() == SCHEMA_VERSION
        conn.exec_driver_sql(f"UPDATE trialflow_schema SET version = {SCHEMA_VERSION + 1}")
    engine.dispose()
    with pytest.raises(StoreUnreadable) as refused:
        ExperimentStore(store_url, "schemaexp")
    message = str(refused.value)
    assert "\n" not in message and "newer trialflow" in message and "upgrade trialflow" in message
    engine = sa.create_engine(store_url)
    with engine.begin() as conn:  # nothing was changed by the refusal; this trialflow's number again
        assert conn.exec_driver_sql("SELECT count(*) FROM trials").scalar() == 1
        conn.exec_driver_sql(f"UPDATE trialflow_schema SET version = {SCHEMA_VERSION}")
    engine.dispose()
    ExperimentStore(store_url, "schemaexp").close()
