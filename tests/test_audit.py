"""The experiment-record audit (:mod:`trialflow.testing.audit`) names every kind of broken record it
looks for, on a record broken on purpose."""

from __future__ import annotations

import sqlite3

import pytest

from tests.conftest import base_config, write_trial
from tests.test_results import SKLEARN_LIKE
from trialflow.config import parse_config
from trialflow.experiments import create_experiment
from trialflow.records.store import ExperimentStore


@pytest.mark.breaks_records
def test_the_audit_names_every_kind_of_broken_record(tmp_path):
    from trialflow.testing.audit import check_experiment

    code = tmp_path / "code"
    write_trial(code, SKLEARN_LIKE)
    exp_id, exp_dir = create_experiment(parse_config(base_config(
        code, tmp_path / "w", maxTrialNumber=3, searchSpace={"accuracy": {"_type": "choice", "_value": [1]}})))
    store = ExperimentStore.embedded(exp_dir, exp_id)
    assert check_experiment(exp_dir) == []
    from trialflow.records.store import Metric

    for i, tid in enumerate(["AAAAA", "BBBBB", "CCCCC", "DDDDD"]):
        store.add_trial(tid, None, i, {"accuracy": 1}, {"accuracy": 0})
    store.add_metrics([Metric("AAAAA", "FINAL", 0, 0.9, 1.0)])
    store.set_status("AAAAA", "EARLY_STOPPED", exit_code=0, when=2.0)  # its own exit, and no start time
    store.set_status("BBBBB", "RUNNING", when=5.0)
    store.add_metrics([Metric("BBBBB", "FINAL", 0, 0.5, 50.0)])
    store.set_status("BBBBB", "SUCCEEDED", exit_code=2, when=10.0)  # exit 2, metric after the end
    store.set_status("CCCCC", "RUNNING", when=1.0)
    store.set_status("CCCCC", "SUCCEEDED", exit_code=0, when=3.0)
    db = sqlite3.connect(exp_dir / "db" / "trialflow.sqlite")
    db.execute("UPDATE trials SET sequence = 0 WHERE id = 'DDDDD'")
    db.execute("UPDATE metrics SET trial_id = 'CCCCC' WHERE trial_id = 'BBBBB'")
    db.execute("INSERT INTO metrics VALUES (?, 'BBBBB', 'FINAL', 0, '0.5', 50.0)", (exp_id,))
    db.commit()
    store.set_experiment(status="DONE", best_trial="AAAAA")
    problems = "\n".join(check_experiment(exp_dir))
    for expected in ["DDDDD (#0): WAITING in an experiment that is DONE",
                     "AAAAA (#0): ran (exit code 0) but has no start time",
                     "AAAAA (#0): EARLY_STOPPED though it exited by itself with code 0",
                     "AAAAA (#0): EARLY_STOPPED though its final result was recorded 1.000 s before the stop",
                     "BBBBB (#1): SUCCEEDED with exit code 2",
                     "BBBBB (#1): 1 metric(s) stored after its end",
                     "CCCCC (#2): SUCCEEDED without the final result it reported",
                     "4 trials for a budget of 3",
                     "trial sequences are not 0..3: duplicated [0], missing [3]"]:
        assert expected in problems
    db = sqlite3.connect(exp_dir / "db" / "trialflow.sqlite")
    db.execute("UPDATE trials SET status = 'USER_CANCELED', end_time = 4 WHERE id = 'DDDDD'")
    db.commit()
    assert "recorded best trial AAAAA but the best under maximize is BBBBB" in "\n".join(check_experiment(exp_dir))
    store.set_handle("DDDDD", {"trial_id": "DDDDD", "platform": "local", "data": {}, "stopping": True})
    assert "DDDDD (#0): USER_CANCELED, its stop never settled, in an experiment that is DONE" in \
        "\n".join(check_experiment(exp_dir))
    # run again after two interruptions, with only one recorded, after its end
    from trialflow.platforms.base import interruption_note

    store.set_handle("CCCCC", {"trial_id": "CCCCC", "platform": "local", "data": {"attempt": 2}})
    store.note("CCCCC", interruption_note(1, "pod p was evicted"))
    problems = "\n".join(check_experiment(exp_dir))
    assert "CCCCC (#2): attempt 2 but its interruption events start attempts [1]" in problems
    assert "CCCCC (#2): an interruption recorded after its end" in problems
