"""The best-trial direction: NNI's rule (tuner, then advisor, then assessor, else maximize), stored with
the experiment, and the same rule for experiments stored before it was."""

from __future__ import annotations

import sqlite3

import pytest

from tests.conftest import base_config, write_trial
from trialflow.config import parse_config
from trialflow.experiments import create_experiment, open_store
from trialflow.experiments.results import maximizes, optimize_mode_of

SKLEARN_LIKE = "import nni\np = nni.get_next_parameter()\nnni.report_final_result(p['accuracy'])\n"


@pytest.mark.parametrize("config,mode", [
    ({}, "maximize"),
    ({"tuner": {"name": "Random"}, "assessor": {"name": "Medianstop", "classArgs": {"optimize_mode": "minimize"}}},
     "minimize"),
    ({"tuner": {"name": "TPE", "classArgs": {"optimize_mode": "minimize"}},
      "assessor": {"name": "Medianstop", "classArgs": {"optimize_mode": "maximize"}}}, "minimize"),
    ({"advisor": {"name": "Hyperband", "classArgs": {"optimize_mode": "minimize"}}}, "minimize"),
    ({"tuner": {"name": "TPE", "classArgs": {"optimize_mode": "sideways"}}}, "maximize"),
])
def test_the_direction_follows_nni_tuner_then_advisor_then_assessor_else_maximize(config, mode):
    assert optimize_mode_of(config) == mode


def test_experiments_stored_before_the_direction_was_open_with_it(tmp_path):
    code = tmp_path / "code"
    write_trial(code, SKLEARN_LIKE)
    config = parse_config(base_config(code, tmp_path / "w", assessor={"name": "Medianstop", "classArgs": {
        "optimize_mode": "minimize"}}, searchSpace={"accuracy": {"_type": "choice", "_value": [1]}}))
    exp_id, exp_dir = create_experiment(config)
    db = sqlite3.connect(exp_dir / "db" / "trialflow.sqlite")  # as a trialflow of before left it: no schema row
    db.execute("DROP TABLE trialflow_schema")
    db.execute("ALTER TABLE experiments DROP COLUMN optimize_mode")
    db.execute("ALTER TABLE experiments DROP COLUMN best_trial")
    db.commit()
    db.close()
    record = open_store(exp_dir.parent, exp_id).experiment()  # the columns come back, empty
    assert record.optimize_mode is None and record.best_trial is None
    assert maximizes(record) is False  # the same rule over the stored config
