"""A new Prefect database starts from this user's migrated empty copy: made by the first server of a
Prefect version, used by the next new ones (kept and temporary servers), holding nothing of any
experiment, and ignored when anyone else could have written it."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import base_config, migrates_on_start, write_trial
from trialflow.app.api import run_experiment
from trialflow.config import parse_config
from trialflow.server.kept_server import ensure_server, running_server, stop_server
from trialflow.server.prefect_db_template import remember, seed, seeded_settings, start_settings, template_for
from trialflow.trial.procs import stop_with

VERSION = "0.0-test"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("TRIALFLOW_CACHE_DIR", str(folder))
    return folder


def _rows(path: Path, table: str) -> list[tuple]:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return db.execute(f'SELECT * FROM "{table}" ORDER BY 1').fetchall()
    finally:
        db.close()


def _migrated_file(path: Path, revision: str = "abc123") -> Path:
    """A minimal database at a migration revision, with one row of a table a template must not keep."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path)
    db.executescript("CREATE TABLE alembic_version (version_num TEXT);"
                     "CREATE TABLE block_type (id TEXT, slug TEXT);"
                     "CREATE TABLE flow_run (id TEXT, name TEXT);"
                     "CREATE TABLE block_document (id TEXT, data TEXT);")
    db.execute("INSERT INTO alembic_version VALUES (?)", (revision,))
    db.execute("INSERT INTO block_type VALUES ('t1', 'secret')")
    db.execute("INSERT INTO flow_run VALUES ('r1', 'someones-run')")
    db.execute("INSERT INTO block_document VALUES ('d1', 'hunter2')")
    db.commit()
    db.close()
    return path


def test_the_template_keeps_the_schema_and_block_types_only_and_seeds_a_new_file_once(tmp_path, cache):
    remember(_migrated_file(tmp_path / "first" / "prefect.db"), VERSION)
    template = template_for(VERSION)
    assert template.stat().st_mode & 0o777 == 0o600 and template.parent.stat().st_mode & 0o777 == 0o700
    assert _rows(template, "alembic_version") == [("abc123",)]
    assert _rows(template, "block_type") == [("t1", "secret")]
    assert _rows(template, "flow_run") == [] and _rows(template, "block_document") == []
    assert b"hunter2" not in template.read_bytes() and b"someones-run" not in template.read_bytes()

    new = tmp_path / "second" / "prefect.db"
    assert seed(new, VERSION) and _rows(new, "alembic_version") == [("abc123",)]
    assert new.stat().st_mode & 0o077 == 0
    assert not seed(new, VERSION)  # an existing database is never replaced
    assert not seed(tmp_path / "third" / "prefect.db", "another-version")  # no template of that version
    assert not (tmp_path / "third" / "prefect.db").exists()


def test_installing_a_prefect_collection_makes_new_databases_register_its_block_types(tmp_path, cache, monkeypatch):
    """A template holds the block types of the collections installed when it was made; once another is
    installed, a new database is no longer seeded from it (its server migrates and registers all)."""
    remember(_migrated_file(tmp_path / "first" / "prefect.db"), VERSION)
    before = template_for(VERSION)
    assert before.is_file() and seed(tmp_path / "second" / "prefect.db", VERSION)
    site = tmp_path / "site"
    info = site / "prefect_fancy-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: prefect-fancy\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[prefect.collections]\nprefect_fancy = prefect_fancy\n")
    monkeypatch.syspath_prepend(str(site))
    assert template_for(VERSION) != before
    assert not seed(tmp_path / "third" / "prefect.db", VERSION)
    assert not (tmp_path / "third" / "prefect.db").exists()


def test_a_seeded_start_skips_only_what_the_copy_holds_and_what_the_user_did_not_set(tmp_path, cache, monkeypatch):
    """The first start on a seeded copy runs neither the migration check nor the block registration,
    unless the environment sets either; a database of a server that never migrated makes no template."""
    remember(_migrated_file(tmp_path / "first" / "prefect.db"), VERSION)
    folder = tmp_path / "server"
    assert start_settings(folder, folder / "prefect.db", VERSION, {}) == {
        "PREFECT_API_DATABASE_MIGRATE_ON_START": "false", "PREFECT_API_BLOCKS_REGISTER_ON_START": "false"}
    registering = {"PREFECT_SERVER_REGISTER_BLOCKS_ON_START": "true"}
    assert start_settings(folder, folder / "other.db", VERSION, registering) == {
        "PREFECT_API_DATABASE_MIGRATE_ON_START": "false"}
    assert start_settings(folder, folder / "third.db", "another-version", {}) == {}  # no copy: migrate, register
    assert seeded_settings({"PREFECT_API_BLOCKS_REGISTER_ON_START": "false"}) == {
        "PREFECT_API_DATABASE_MIGRATE_ON_START": "false"}

    monkeypatch.setenv("PREFECT_SERVER_DATABASE_MIGRATE_ON_START", "False")
    remember(_migrated_file(tmp_path / "old" / "prefect.db", revision="old"), "1.2-unmigrated")
    assert not template_for("1.2-unmigrated").exists()


@pytest.mark.parametrize("damage", ["group-writable", "symlink", "not-sqlite", "not-sqlite-wal", "no-revision",
                                    "other-user"])
def test_a_template_anyone_else_could_have_written_or_that_does_not_read_is_not_used(tmp_path, cache, damage):
    template = template_for(VERSION)
    remember(_migrated_file(tmp_path / "first" / "prefect.db"), VERSION)
    if damage == "group-writable":
        template.chmod(0o664)
    elif damage == "symlink":
        real = _migrated_file(tmp_path / "elsewhere.db")
        template.unlink()
        template.symlink_to(real)
    elif damage == "not-sqlite":
        template.write_bytes(b"SQLite format 3\x00" + os.urandom(4096))
    elif damage == "not-sqlite-wal":  # a WAL header: reading it makes -wal and -shm files beside it
        template.write_bytes(b"SQLite format 3\x00" + bytes([16, 0, 2, 2]) + os.urandom(4092))
    elif damage == "no-revision":
        db = sqlite3.connect(template)
        db.execute("DELETE FROM alembic_version")
        db.commit()
        db.close()
    else:
        if subprocess.run(["id", "trialflow-other"], capture_output=True).returncode != 0:
            pytest.skip("needs the second Unix user trialflow-other")
        os.chown(template, int(subprocess.check_output(["id", "-u", "trialflow-other"])), -1)
    new = tmp_path / "new" / "prefect.db"
    assert not seed(new, VERSION)
    assert not new.exists() and list(new.parent.glob("*")) == []  # nothing left behind for Prefect


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_a_new_kept_or_temporary_server_starts_from_the_first_ones_copy_and_runs_an_experiment(
        tmp_path, cache, monkeypatch):
    """The first kept server of an empty cache migrates and leaves the template; a kept server of
    another home, and Prefect's temporary server in a new Prefect home, start from it (the block types'
    ids are the template's, which a migration would have made anew) and run an experiment."""
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    first_home, second_home = tmp_path / "a", tmp_path / "b"
    try:
        first = ensure_server(first_home, port=0)
        stop_with(os.getpid(), first.pid)
        assert migrates_on_start(first)  # no copy yet: its new database was created and migrated
        template = template_for(first.prefect)
        assert template.is_file()
        made = {row[0] for row in _rows(template, "block_type")}
        assert made and _rows(template, "flow_run") == []
        second = ensure_server(second_home, port=0)
        stop_with(os.getpid(), second.pid)
        assert {row[0] for row in _rows(second.database, "block_type")} >= made
        assert _rows(second.database, "block_type") == _rows(template, "block_type")  # none written again
        assert not migrates_on_start(second)
    finally:
        stop_server(first_home)
    monkeypatch.setenv("TRIALFLOW_HOME", str(second_home))
    monkeypatch.setenv("TRIALFLOW_PREFECT_SERVER", "kept")
    write_trial(tmp_path / "code", "import nni\nnni.get_next_parameter()\nnni.report_final_result(1)\n")
    try:
        result = run_experiment(_config(tmp_path))
        assert result.status == "DONE" and [t.status for t in result.trials] == ["SUCCEEDED"]
        assert running_server(second_home) is not None
    finally:
        stop_server(second_home)

    prefect_home = tmp_path / "prefect-home"
    script = ("from trialflow.flows.temporary_server import start_temporary_server\n"
              "from prefect import flow\n"
              "print(start_temporary_server())\n"
              "print(flow(lambda: 'ran')())\n")
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**env, "PREFECT_HOME": str(prefect_home)})
    assert done.returncode == 0 and done.stdout.strip().endswith("ran"), done.stderr[-2000:]
    assert {row[0] for row in _rows(prefect_home / "prefect.db", "block_type")} >= made
    assert _rows(prefect_home / "prefect.db", "block_type") == _rows(template, "block_type")


def _config(tmp_path: Path):
    return parse_config(base_config(tmp_path / "code", tmp_path / "w", maxTrialNumber=1))
