"""Write the store asset of this trialflow's schema version: ``tests/assets/stores/v<N>/`` with

* ``trialflow.sqlite``: an embedded store holding one experiment;
* ``postgres.sql``: a ``pg_dump`` of a shared PostgreSQL store holding two;
* ``rows.json``: every row of every table of both, as written.

Run it (``python3 scripts/write_store_asset.py``) when a change bumps the store's schema version, and
commit what it writes: ``tests/test_store_upgrades.py`` opens every asset with the code of each later
version and checks each row. The records are written through the store's API as an experiment's run
writes them, with fixed times and ids so that a rewrite changes nothing but what the new version
changed. Needs Debian's ``postgresql`` (for ``pg_dump``).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import sqlalchemy as sa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trialflow.records.store import SCHEMA_VERSION, ExperimentStore, Metric  # noqa: E402

try:  # the control keys' enum (schema 2 on); earlier versions named them by text
    from trialflow.records.store import Control as _Control  # noqa: E402

    def control(name: str) -> Any:
        return _Control(name)
except ImportError:
    def control(name: str) -> Any:
        return name
from trialflow.testing.postgres import LocalPostgres  # noqa: E402

T0 = 1_790_000_000.0  # every time written is T0 plus a fixed offset
CONFIG = {
    "experimentName": "asset", "trialCommand": "python3 trial.py", "trialCodeDirectory": "/work/code",
    "trialConcurrency": 2, "maxTrialNumber": 5, "maxExperimentDuration": "1h",
    "searchSpace": {"lr": {"_type": "loguniform", "_value": [1e-4, 0.1]},
                    "layers": {"_type": "choice", "_value": [1, 2, 3]}},
    "tuner": {"name": "TPE", "classArgs": {"optimize_mode": "maximize"}},
    "assessor": {"name": "Medianstop", "classArgs": {"optimize_mode": "maximize"}},
    "trainingService": {"platform": "local"},
}


def write_experiment(store: ExperimentStore, name: str) -> None:
    """One finished experiment with a trial of each outcome, metrics, imported data and controls."""
    store.create_experiment(name, CONFIG, "/work/config.yml", optimize_mode="maximize")
    store.set_experiment(start_time=T0, status="RUNNING", controller_pid=4242)
    outcomes = [("SUCCEEDED", 0, None), ("FAILED", 3, "exit code 3; stderr tail:\nboom ünïcode"),
                ("EARLY_STOPPED", 130, "stopped by the assessor"), ("USER_CANCELED", None, "cancelled by the user"),
                ("SUCCEEDED", 0, None)]
    for i, (status, code, message) in enumerate(outcomes):
        trial_id = f"{name[:3]}T{i}"
        params = {"lr": 10 ** -(i + 1), "layers": i % 3 + 1}
        store.add_trial(trial_id, None, i, params, {"lr": params["lr"], "layers": i % 3},
                        f"/work/{name}/trials/{trial_id}")
        store.set_handle(trial_id, {"trial_id": trial_id, "platform": "local",
                                    "data": {"trial_dir": f"/work/{name}/trials/{trial_id}", "sequence": i}})
        store.set_status(trial_id, "RUNNING", when=T0 + 10 * i + 1)
        store.add_metrics([Metric(trial_id, "PERIODICAL", k, {"default": 0.1 * (i + k), "loss": float("nan")},
                                  T0 + 10 * i + 2 + k) for k in range(3)])
        if status == "SUCCEEDED":
            store.add_metrics([Metric(trial_id, "FINAL", 0, 0.5 + 0.1 * i, T0 + 10 * i + 6)])
        if status in ("EARLY_STOPPED", "USER_CANCELED"):
            store.set_status(trial_id, status, message=message, when=T0 + 10 * i + 7)
            store.settle(trial_id, status, code, message)
        else:
            store.set_status(trial_id, status, exit_code=code, message=message, when=T0 + 10 * i + 7)
    store.note(f"{name[:3]}T1", "resubmitted after an interruption (node lost)")
    store.add_imported([({"lr": 0.01, "layers": 2}, {"lr": 0.01, "layers": 1}, 0.42),
                        ({"lr": 0.001, "layers": 3}, {"lr": 0.001, "layers": 2}, {"default": 0.37, "acc": 0.9})])
    for key, value in [("max_trial_number", 5), ("trial_concurrency", 3), ("stop", False), ("kill", [f"{name[:3]}T3"]),
                       ("elapsed_seconds", 61.5), ("search_space", CONFIG["searchSpace"])]:
        store.set_control(control(key), value)
    if SCHEMA_VERSION >= 2:  # a warm start's import, and the update history
        store.add_imported([({"lr": 0.05, "layers": 1}, {"lr": 0.05, "layers": 0}, 0.3)], source="warm0001")
        store.set_control(control("max_trial_number"), 4, via="trialflow update")
        store.set_control(control("max_trial_number"), 5, via="trialflow resume")
    store.set_experiment(status="DONE", end_time=T0 + 100, best_trial=f"{name[:3]}T4", controller_pid=None,
                         flow_run_id="0f0e0d0c-0b0a-4909-8807-060504030201", prefect_api="http://127.0.0.1:4200/api")


def fixed_times(engine: sa.Engine) -> None:
    """The times the API took from the clock (submit, settle, notes) set to fixed ones."""
    with engine.begin() as conn:
        conn.exec_driver_sql(f"UPDATE trials SET submit_time = {T0} + sequence * 10")
        conn.exec_driver_sql(f"UPDATE trials SET end_time = {T0} + sequence * 10 + 8 WHERE end_time > {T0 + 1000}")
        conn.exec_driver_sql(  # a trial's first event at its submission, later ones just after its end
            "UPDATE trial_events SET time = (SELECT t.submit_time FROM trials t WHERE t.experiment_id = "
            "trial_events.experiment_id AND t.id = trial_events.trial_id) + CASE WHEN status = 'WAITING' THEN 0 "
            f"ELSE 9 END WHERE time > {T0 + 1000}")
        conn.exec_driver_sql(f"UPDATE metrics SET time = {T0} + 50 WHERE time > {T0 + 1000}")
        if SCHEMA_VERSION >= 2:
            conn.exec_driver_sql(f"UPDATE experiment_updates SET time = {T0} + 90 + id")


def rows(engine: sa.Engine) -> dict[str, list[dict[str, Any]]]:
    """Every row of every table, ordered by all its columns."""
    out = {}
    meta = sa.MetaData()
    meta.reflect(engine)
    with engine.connect() as conn:
        for name, table in sorted(meta.tables.items()):
            found = conn.execute(sa.select(table).order_by(*table.columns)).all()
            out[name] = [dict(r._mapping) for r in found]
    return out


def main() -> None:
    target = ROOT / "tests" / "assets" / "stores" / f"v{SCHEMA_VERSION}"
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trialflow.sqlite"
        store = ExperimentStore(f"sqlite:///{path}", "embedded1")
        write_experiment(store, "embedded1")
        fixed_times(store.engine)
        store.close()
        with sqlite3.connect(path) as db:  # one file: the WAL folded in
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            db.execute("PRAGMA journal_mode=DELETE")
        shutil.copyfile(path, target / "trialflow.sqlite")
        embedded = rows(sa.create_engine(f"sqlite:///{target / 'trialflow.sqlite'}"))

    with LocalPostgres() as pg:
        for exp_id in ("shared01", "shared02"):
            store = ExperimentStore(pg.url, exp_id)
            write_experiment(store, exp_id)
            store.close()
        engine = sa.create_engine(pg.url)
        fixed_times(engine)
        shared = rows(engine)
        engine.dispose()
        dump = subprocess.run([str(pg.bin / "pg_dump"), "--no-owner", "--no-privileges", "-h", "127.0.0.1",
                               "-p", str(pg.port), "-U", "trialflow", "-d", "postgres"],
                              check=True, capture_output=True, text=True, timeout=120).stdout
        (target / "postgres.sql").write_text(dump, encoding="utf-8")
    (target / "rows.json").write_text(json.dumps({"schema_version": SCHEMA_VERSION, "sqlite": embedded,
                                                  "postgresql": shared}, indent=1, sort_keys=True) + "\n",
                                      encoding="utf-8")
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
