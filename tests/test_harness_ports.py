"""Ports for the servers tests start: chosen where outgoing connections never take them."""

from __future__ import annotations

import socket

import pytest

from trialflow.testing import ports


def test_a_free_port_is_below_the_ephemeral_range_and_bindable():
    start = ports._ephemeral_start()
    chosen = {ports.free_port() for _ in range(20)}
    assert all(ports.LOWEST <= port < start for port in chosen) and len(chosen) > 1
    with socket.socket() as s:
        s.bind(("127.0.0.1", chosen.pop()))


def test_a_port_in_use_is_never_chosen(monkeypatch):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        monkeypatch.setattr(ports, "LOWEST", taken)
        monkeypatch.setattr(ports, "_ephemeral_start", lambda: taken + 1000)
        assert all(ports.free_port() != taken for _ in range(50))


@pytest.mark.e2e
def test_a_killed_test_process_leaves_no_prefect_server_nor_worker_behind(tmp_path):
    """The test harness's ``prefect server start`` and the workers spawned against it stop by themselves
    when the process that started them is killed (its fixtures' teardown never runs)."""
    import json
    import subprocess
    import sys
    import time

    from trialflow.trial.procs import group_alive

    code = ("import json, os, signal, sys\n"
            "from pathlib import Path\n"
            "from trialflow.testing.prefect_server import PrefectServer\n"
            "server = PrefectServer(Path(sys.argv[1])).start()\n"
            "worker = server.spawn(['prefect', 'worker', 'start', '--pool', 'check'], Path(sys.argv[1]) / 'w')\n"
            "print(json.dumps([server.proc.pid, worker.pid]), flush=True)\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "home")], capture_output=True, text=True,
                          timeout=180)
    groups = json.loads(done.stdout.strip().splitlines()[-1])
    deadline = time.monotonic() + 60
    while any(group_alive(pgid) for pgid in groups) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(group_alive(pgid) for pgid in groups), (groups, done.stderr[-2000:])


def test_a_killed_test_process_leaves_no_sshd_listening(tmp_path):
    """The loopback sshd a test starts stops by itself when the process that started it is killed (its
    fixtures' teardown never runs): nothing listens on its port afterwards."""
    import json
    import subprocess
    import sys
    import time

    from trialflow.trial.procs import group_alive

    code = ("import json, os, signal, sys\n"
            "from pathlib import Path\n"
            "from trialflow.testing.sshd import LoopbackSshd\n"
            "server = LoopbackSshd(Path(sys.argv[1])).start()\n"
            "print(json.dumps([server.proc.pid, server.port]), flush=True)\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "sshd")], capture_output=True, text=True,
                          timeout=60)
    pid, port = json.loads(done.stdout.strip().splitlines()[-1])
    deadline = time.monotonic() + 30
    while group_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not group_alive(pid), done.stderr[-2000:]
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
