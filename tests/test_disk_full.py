"""A disk that fills up under a running experiment (its folder on a small tmpfs of its own): the
controller stops with one line that says what to do, its trials go on, the record stays consistent, and
`trialflow resume` finishes the experiment once space is freed -- with the outcome of a trial that ended
while the disk was full."""

from __future__ import annotations

import errno
import json
import logging
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import base_config, wait_for, write_trial
from trialflow.experiments import open_store
from trialflow.records.disk_space import SpaceTolerantFileHandler, no_space
from trialflow.records.store import DB_RELATIVE_PATH
from trialflow.testing.audit import check_folder
from trialflow.trial.procs import write_when_space

# Reports its final result first, then lingers until the test lets it end.
LINGERING = "import os, time, nni\np = nni.get_next_parameter()\nnni.report_final_result(p['x'])\n" \
            "while os.path.exists({hold!r}):\n    time.sleep(0.1)\n"


@pytest.fixture
def small_disk(tmp_path):
    """A 24 MiB tmpfs mounted on a folder of the test's own (root only: the suite runs as root)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(disk)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _fill(disk: Path) -> Path:
    """Write a file on ``disk`` until no byte is left."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 20, 4096, 1):
            try:
                while True:
                    os.write(fd, b"x" * size)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler


def _trialflow(*args: str, out: Path) -> subprocess.Popen[bytes]:
    with open(out, "wb") as f:
        return subprocess.Popen([sys.executable, "-m", "trialflow.cli", *args], stdout=f, stderr=subprocess.STDOUT,
                                env={**os.environ, "COLUMNS": "200"})


@pytest.mark.e2e
@pytest.mark.usefixtures("prefect_server")
def test_a_full_disk_stops_the_controller_in_one_line_and_resume_finishes_with_every_outcome(tmp_path, small_disk):
    code, hold = tmp_path / "code", tmp_path / "hold"
    hold.touch()
    write_trial(code, LINGERING.format(hold=str(hold)))
    config = tmp_path / "config.yml"
    config.write_text(yaml.safe_dump(base_config(code, small_disk / "w", trialConcurrency=2, maxTrialNumber=2)))
    created = _trialflow("create", "--config", str(config), "--foreground", out=tmp_path / "create.out")
    try:
        # its database file, not just its folder: on a loaded machine (r53) the test came between the two
        folders = wait_for(lambda: [p for p in (small_disk / "w").glob("*") if (p / DB_RELATIVE_PATH).is_file()])
        store = open_store(small_disk / "w", folders[0].name)
        wait_for(lambda: sum(len(store.metrics(t.id, "FINAL")) for t in store.trials(["RUNNING"])) == 2,
                 timeout=120)
        filler = _fill(small_disk)
        assert created.wait(timeout=60) == 1
    finally:
        if created.poll() is None:
            created.kill()
    exp_id = folders[0].name
    out = (tmp_path / "create.out").read_text()
    line = (f"error: no space left on the device of {small_disk / 'w' / exp_id}: experiment {exp_id} stopped, "
            f"its running trials go on; free space, then `trialflow resume {exp_id}`")
    assert line in out
    assert "Traceback" not in out and "Logging error" not in out, out
    assert [t.status for t in store.trials()] == ["RUNNING", "RUNNING"]  # neither cancelled nor failed
    assert store.experiment().status == "RUNNING"

    hold.unlink()  # the trials end while the disk is full: their keepers wait to record it
    time.sleep(1.5)
    still_full = subprocess.run([sys.executable, "-m", "trialflow.cli", "resume", exp_id, "--root",
                                 str(small_disk / "w"), "--foreground"], capture_output=True, text=True, timeout=120)
    said = (still_full.stdout + still_full.stderr).strip()
    assert still_full.returncode == 1 and said.startswith("error: no space left on the device") \
        and said.endswith("free space, then run the command again") or said == line, said
    assert "\n" not in said

    filler.unlink()
    resumed = subprocess.run([sys.executable, "-m", "trialflow.cli", "resume", exp_id, "--root",
                              str(small_disk / "w"), "--foreground"], capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert store.experiment().status == "DONE"
    trials = store.trials()
    assert [(t.status, t.exit_code) for t in trials] == [("SUCCEEDED", 0), ("SUCCEEDED", 0)]
    assert all(t.final == t.parameters["x"] for t in trials)
    audited, problems = check_folder(small_disk / "w" / exp_id)  # before the tmpfs goes with the fixture
    assert audited == 1 and problems == []


def test_a_full_disk_is_found_however_deep_it_is_wrapped():
    import sqlalchemy.exc

    try:
        try:
            raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.OperationalError as inner:
            raise sqlalchemy.exc.OperationalError("COMMIT", None, inner) from inner
    except sqlalchemy.exc.OperationalError as wrapped:
        assert str(no_space(wrapped)) == "database or disk is full"
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device", "/x/y")
        except OSError:
            raise RuntimeError("writing the log failed") from None  # the context is kept
    except RuntimeError as outer:
        assert isinstance(no_space(outer), OSError) and no_space(outer).filename == "/x/y"  # type: ignore[union-attr]
    assert no_space(OSError(errno.EACCES, "Permission denied")) is None
    assert no_space(sqlite3.OperationalError("database is locked")) is None


def test_a_log_file_on_a_full_disk_drops_records_without_a_traceback(small_disk, capfd):
    handler = SpaceTolerantFileHandler(small_disk / "controller.log", encoding="utf-8")
    logger = logging.getLogger("trialflow.test-full-disk")
    logger.addHandler(handler)
    try:
        _fill(small_disk)
        for n in range(200):
            logger.warning("record %d of a run on a full disk %s", n, "x" * 200)
    finally:
        logger.removeHandler(handler)
        handler.close()  # its last flush fails too: not raised
    assert "Logging error" not in capfd.readouterr().err


def test_a_trials_end_is_written_once_space_is_freed(small_disk):
    filler = _fill(small_disk)
    state = small_disk / "state"
    writer = threading.Thread(target=write_when_space, args=(str(state), {"exit_code": 0}, 0.05))
    writer.start()
    time.sleep(0.5)
    assert writer.is_alive() and not state.exists()
    # each try makes a temporary file and removes it when the write fails: between two tries, none is left
    wait_for(lambda: [p.name for p in small_disk.iterdir()] == ["filler"], timeout=5, interval=0.01)
    filler.unlink()
    writer.join(timeout=10)
    assert json.loads(state.read_text()) == {"exit_code": 0}
