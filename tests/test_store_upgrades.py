"""Stores written by every earlier schema version (``tests/assets/stores/v<N>/``, written by
``scripts/write_store_asset.py`` with that version's code) open with today's code: upgraded to its
schema version, with every row they held, read back through the store's API; two processes opening
one old store at once upgrade it once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from trialflow.records.store import SCHEMA_VERSION, ExperimentStore
from trialflow.records.store_schema import STEPS

ASSETS = sorted((Path(__file__).parent / "assets" / "stores").glob("v*"), key=lambda p: int(p.name[1:]))
IDS = {"sqlite": ["embedded1"], "postgresql": ["shared01", "shared02"]}


def test_every_schema_version_has_its_asset_and_its_step():
    assert [int(p.name[1:]) for p in ASSETS] == list(range(1, SCHEMA_VERSION + 1))
    assert sorted(STEPS) == list(range(1, SCHEMA_VERSION + 1))
    for asset in ASSETS:
        assert json.loads((asset / "rows.json").read_text())["schema_version"] == int(asset.name[1:])


def _sqlite_copy(asset: Path, tmp_path: Path) -> str:
    path = tmp_path / f"{asset.name}.sqlite"
    path.write_bytes((asset / "trialflow.sqlite").read_bytes())
    return f"sqlite:///{path}"


def _postgres_copy(asset: Path, server, name: str) -> str:
    """A new database on ``server`` loaded from the asset's dump; its URL."""
    admin = sa.create_engine(server.url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    admin.dispose()
    subprocess.run([str(server.bin / "psql"), "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", str(server.port),
                    "-U", "trialflow", "-d", name, "-f", str(asset / "postgres.sql")],
                   check=True, capture_output=True, timeout=120)
    return server.url.rsplit("/", 1)[0] + f"/{name}"


def _check_upgraded(url: str, asset: Path, backend: str) -> None:
    """Every row of the asset is in the store with the same values (a column added since is empty),
    nothing else is, the schema version is today's, and the API reads what the rows hold."""
    expected = json.loads((asset / "rows.json").read_text())[backend]
    engine = sa.create_engine(url)
    meta = sa.MetaData()
    meta.reflect(engine)
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT version FROM trialflow_schema").scalars().all() == [SCHEMA_VERSION]
            for name, rows in expected.items():
                if name == "trialflow_schema":
                    continue
                table = meta.tables[name]
                found = [dict(r._mapping) for r in conn.execute(sa.select(table).order_by(*table.columns))]
                assert len(found) == len(rows), name
                for old, new in zip(rows, found, strict=True):
                    assert {k: new[k] for k in old} == old, name
                    assert all(new[k] is None for k in set(new) - set(old)), (name, new)
    finally:
        engine.dispose()
    for exp_id in IDS[backend]:
        store = ExperimentStore(url, exp_id)
        try:
            record = store.experiment()
            assert record.status == "DONE" and record.best_trial is not None and record.optimize_mode == "maximize"
            assert record.controls["max_trial_number"] == 5 and record.controls["search_space"]["layers"]
            trials = store.trials()
            assert [t.status for t in trials] == ["SUCCEEDED", "FAILED", "EARLY_STOPPED", "USER_CANCELED",
                                                  "SUCCEEDED"]
            assert [t.final for t in trials if t.status == "SUCCEEDED"] == [0.5, 0.9]
            assert trials[1].exit_code == 3 and "ünïcode" in trials[1].message
            assert [s for s, _, _ in store.status_history(trials[2].id)] == ["WAITING", "RUNNING", "EARLY_STOPPED"]
            metrics = store.metrics(trials[0].id, "PERIODICAL")
            assert [m.value["default"] for m in metrics] == [0.0, 0.1, 0.2] and metrics[0].value["loss"] == "nan"
            assert [value for _, _, value in store.imported()][:2] == [0.42, {"default": 0.37, "acc": 0.9}]
            written = [r for r in expected.get("experiment_updates", []) if r["experiment_id"] == exp_id]
            assert [(u.control, u.value, u.via) for u in store.updates()] == [
                (r["field"], json.loads(r["value"]), r["via"]) for r in written]
            sources = [r["source"] for r in expected["imported_data"] if r["experiment_id"] == exp_id] \
                if "source" in expected["imported_data"][0] else [None, None]
            assert sum(store.imported_sources().values()) == len(sources)
        finally:
            store.close()


@pytest.mark.parametrize("asset", ASSETS, ids=lambda p: p.name)
def test_an_embedded_store_of_each_version_opens_upgraded_with_every_row(asset, tmp_path):
    url = _sqlite_copy(asset, tmp_path)
    ExperimentStore(url, "embedded1").close()
    _check_upgraded(url, asset, "sqlite")
    ExperimentStore(url, "embedded1").close()  # a second opening finds nothing to do
    _check_upgraded(url, asset, "sqlite")


@pytest.mark.parametrize("asset", ASSETS, ids=lambda p: p.name)
def test_a_shared_postgresql_store_of_each_version_opens_upgraded_with_every_row(asset, postgres_server):
    url = _postgres_copy(asset, postgres_server, f"upgrade_{asset.name}")
    ExperimentStore(url, "shared01").close()
    _check_upgraded(url, asset, "postgresql")


OPEN_AT = """
import sys, time
from trialflow.records.store import ExperimentStore
start = float(sys.argv[3])
time.sleep(max(0.0, start - time.time()))
ExperimentStore(sys.argv[1], sys.argv[2]).close()
"""


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_processes_opening_one_old_store_at_once_upgrade_it_once(backend, tmp_path, request):
    import time

    oldest = ASSETS[0]
    if backend == "sqlite":
        url = _sqlite_copy(oldest, tmp_path)
    else:
        url = _postgres_copy(oldest, request.getfixturevalue("postgres_server"), "upgrade_race")
    start = time.time() + 3.0  # after every interpreter has started
    procs = [subprocess.Popen([sys.executable, "-c", OPEN_AT, url, IDS[backend][0], str(start)],
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    _check_upgraded(url, oldest, backend)
