"""Spare controllers, as a user meets them: `trialflow create` twice from one shell, the second run by
the spare the first left behind (in the second's directory and umask); a shell with another environment
served by a controller of its own; the spare's socket refusing another user and crafted lines; the
kept server's end ending the spare with nothing left behind."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import as_other_user, wait_for
from tests.test_kept_server import CONSOLE_SCRIPT, _cli, _config, _env
from trialflow.app.spare_controller import start_spare
from trialflow.experiments import open_store
from trialflow.foundation.process_fingerprint import fingerprint
from trialflow.server.kept_server import ensure_server, server_home, stop_server
from trialflow.server.spare_record import RECORD
from trialflow.trial.procs import pid_alive, read_json

pytestmark = [pytest.mark.timeout(300), pytest.mark.e2e, pytest.mark.xdist_group("kept_server")]
ON = {"TRIALFLOW_SPARE_CONTROLLER": "1"}
# a trial that runs long enough to look at its controller, and leaves a file made with its umask
SLOW = ("import nni, time\nnni.get_next_parameter()\nopen('made-' + nni.get_trial_id(), 'w').close()\n"
        "time.sleep(3)\nnni.report_final_result(1)\n")
SEES = "import nni, os\nnni.get_next_parameter()\nnni.report_final_result(float(os.environ['SPARE_TEST_SETTING']))\n"


@pytest.fixture
def home(tmp_path):
    """A TRIALFLOW_HOME whose kept server (and so its spare) is stopped after the test."""
    yield tmp_path / "home"
    stop_server(tmp_path / "home")


def _ready_spare(home: Path) -> dict:
    """The spare's record once it listens (it waits a little, then imports)."""
    def ready():
        record = read_json(str(server_home(home) / RECORD))
        return record if record and record.get("socket") and pid_alive(record["pid"]) else None
    return wait_for(ready, timeout=120)


def _started(proc: subprocess.CompletedProcess[str]) -> tuple[str, int]:
    """(experiment id, controller pid) from `create`'s output."""
    assert proc.returncode == 0, proc.stdout + proc.stderr
    match = re.search(r"experiment (\w+) started in the background \(pid (\d+)\)", proc.stdout)
    assert match, proc.stdout
    return match.group(1), int(match.group(2))


def _done(root: Path, exp_id: str) -> str:
    store = open_store(root, exp_id)
    try:
        return wait_for(lambda: store.experiment().status if store.experiment().status in ("DONE", "ERROR") else None)
    finally:
        store.close()


def _answer(path: str, line: bytes) -> bytes:
    """What the spare's socket answers ``line`` (b"" when it closes without a word)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(10)
        conn.connect(path)
        try:
            conn.sendall(line)
            return conn.recv(100)
        except (BrokenPipeError, ConnectionResetError):
            return b""


def _other_users_python() -> str:
    """A Python the second user may run (this one may live in root's home)."""
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(candidate) and as_other_user(candidate, "-c", "pass").returncode == 0:
            return candidate
    pytest.skip("no Python the second user may run")


def test_the_next_create_from_the_same_shell_runs_in_the_spare_in_its_directory_and_umask(tmp_path, home):
    first = _cli(home, "create", "--config", str(_config(tmp_path, "first", maxTrialNumber=1)), **ON)
    first_id, first_pid = _started(first)
    spare = _ready_spare(home)
    assert spare["pid"] != first_pid
    folder = os.path.dirname(spare["socket"])
    assert os.stat(folder).st_mode & 0o777 == 0o700

    # crafted lines and a stranger: each connection is closed without a word, the spare waits on
    assert _answer(spare["socket"], b"not a claim\n") == b""
    assert _answer(spare["socket"], b"{" * (2 << 20)) == b""
    python = _other_users_python()
    claim = json.dumps({"fingerprint": fingerprint(), "env": {}, "cwd": "/", "umask": 18})
    knock = ("import socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.settimeout(10)\ns.connect(sys.argv[1])\n"
             "try:\n    s.sendall(sys.argv[2].encode() + b'\\n')\n    print(repr(s.recv(100)))\n"
             "except (BrokenPipeError, ConnectionResetError):\n    print(repr(b''))\n")
    denied = as_other_user(python, "-c", knock, spare["socket"], claim)
    assert denied.returncode != 0 and "Permission denied" in denied.stderr  # the 0700 folder, the 0600 socket
    assert os.stat(spare["socket"]).st_mode & 0o777 == 0o600
    os.chmod(folder, 0o711)  # as if both were open: the spare still asks who connects
    os.chmod(spare["socket"], 0o666)
    try:
        stranger = as_other_user(python, "-c", knock, spare["socket"], claim)
    finally:
        os.chmod(folder, 0o700)
        os.chmod(spare["socket"], 0o600)
    assert stranger.returncode == 0 and stranger.stdout.strip() == "b''", stranger.stdout + stranger.stderr
    assert read_json(str(server_home(home) / RECORD)) == spare and pid_alive(spare["pid"])

    # a config with a mistake: one line, and the spare waits on for the corrected one
    bad = tmp_path / "bad.yml"
    bad.write_text(config_text := _config(tmp_path, "second", trial=SLOW, maxTrialNumber=1).read_text())
    bad.write_text(config_text.replace("trialConcurrency", "trialConcurency"))
    refused = _cli(home, "create", "--config", str(bad), **ON)
    assert refused.returncode == 1 and "did you mean 'trialConcurrency'" in refused.stdout
    again = _ready_spare(home)
    assert again["pid"] == spare["pid"] and again["socket"] != spare["socket"]
    assert not os.path.exists(folder)
    spare, folder = again, os.path.dirname(again["socket"])

    # the second create, from another directory with umask 077: the spare runs it
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    config = tmp_path / "second.yml"
    second = subprocess.run([*CONSOLE_SCRIPT, "create", "--config", os.path.relpath(config, elsewhere)],
                            cwd=elsewhere, env=_env(home, **ON), capture_output=True, text=True, timeout=180,
                            preexec_fn=lambda: os.umask(0o077))
    second_id, second_pid = _started(second)
    assert second_pid == spare["pid"]
    assert os.readlink(f"/proc/{second_pid}/cwd") == str(elsewhere)
    root = tmp_path / "w"
    assert _done(root, second_id) == "DONE" and _done(root, first_id) == "DONE"
    store = open_store(root, second_id)
    (trial,) = store.trials()
    store.close()
    made = tmp_path / "code-second" / f"made-{trial.id}"
    assert made.stat().st_mode & 0o777 == 0o600  # the second shell's umask, not the first's
    log = root / second_id / "log" / "controller.out"
    assert log.exists() and not Path(spare["spool"]).exists()
    assert not os.path.exists(folder)  # claimed: its socket is gone
    # and a new spare waits for the next create
    assert _ready_spare(home)["pid"] not in (first_pid, second_pid)


def test_a_shell_with_another_environment_gets_a_controller_of_its_own(tmp_path, home):
    _started(_cli(home, "create", "--config", str(_config(tmp_path, "first", trial=SEES, maxTrialNumber=1)),
                  SPARE_TEST_SETTING="1", **ON))
    spare = _ready_spare(home)
    exp_id, pid = _started(_cli(home, "create", "--config", str(_config(tmp_path, "second", trial=SEES,
                                                                        maxTrialNumber=1)),
                                SPARE_TEST_SETTING="2", **ON))
    assert pid != spare["pid"]
    wait_for(lambda: not pid_alive(spare["pid"]), timeout=30)  # its settings are no one's now
    assert not os.path.exists(os.path.dirname(spare["socket"])) and not Path(spare["spool"]).exists()
    assert _done(tmp_path / "w", exp_id) == "DONE"
    store = open_store(tmp_path / "w", exp_id)
    try:
        assert [t.final for t in store.trials()] == [2.0]  # the trial saw this shell's setting
    finally:
        store.close()


@pytest.mark.parametrize("end", ["server stop", "server killed"])
def test_the_kept_servers_end_ends_its_spare_and_leaves_nothing_behind(home, monkeypatch, end):
    server = ensure_server(home)
    monkeypatch.setenv("TRIALFLOW_HOME", str(home))
    for name, value in {**server.client_settings(), **ON}.items():
        monkeypatch.setenv(name, value)
    start_spare(dict(os.environ))
    spare = _ready_spare(home)
    status = _cli(home, "server", "status")
    assert f"spare controller: pid {spare['pid']}, ready for the next background create" in status.stdout, status.stdout
    if end == "server stop":
        stop_server(home)
        assert not pid_alive(spare["pid"])
    else:
        os.killpg(server.pid, signal.SIGKILL)
        wait_for(lambda: not pid_alive(spare["pid"]), timeout=30)
    assert not os.path.exists(os.path.dirname(spare["socket"]))
    assert not Path(spare["spool"]).exists() and not (server_home(home) / RECORD).exists()


def test_the_fingerprint_follows_trialflows_files_and_the_resource_limits():
    import resource

    import trialflow.app.spare_controller as module

    before = fingerprint()
    assert fingerprint() == before
    path = Path(module.__file__)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    try:
        assert fingerprint() != before  # a spare started before the change would run the old file
    finally:
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert fingerprint() == before
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft - 1, hard))  # `ulimit -n` in the claimant's shell
    try:
        assert fingerprint() != before
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
