"""The kept server's keeper and the server's folder: a server whose folder is removed is stopped (killed
when it does not stop), and one whose folder stays is left alone. A stand-in server (a few lines that
say they serve, then sleep and ignore SIGTERM) runs under the keeper in this process, its checks made
fast; the kept server itself under it: tests/test_kept_server.py."""

from __future__ import annotations

import os
import shutil
import socket
import sys
import time
from pathlib import Path

from tests.conftest import run_in_thread, wait_for
from trialflow.server import port_keeper
from trialflow.trial.procs import pid_alive

STUBBORN = """import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(sys.argv[1], "w") as f:
    f.write(str(os.getpid()))
os.write(int(sys.argv[sys.argv.index("--ready-fd") + 1]), b"ready")
time.sleep(60)
"""


def test_a_removed_folder_stops_its_server_even_one_that_ignores_sigterm_and_frees_the_port(
        tmp_path: Path, monkeypatch, capfd):
    monkeypatch.setattr(port_keeper, "FOLDER_CHECK_SECONDS", 0.1)
    monkeypatch.setattr(port_keeper, "STOP_GRACE_SECONDS", 1.0)
    folder = tmp_path / "prefect-server"
    folder.mkdir()
    pid_file = tmp_path / "server.pid"
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    port = sock.getsockname()[1]
    keeper = port_keeper.Keeper(sock.fileno(), [sys.executable, "-c", STUBBORN, str(pid_file)], str(folder))
    thread, outcome = run_in_thread(keeper.run)
    server = 0
    try:
        wait_for(lambda: pid_file.exists() and pid_file.read_text(), timeout=30)
        server = int(pid_file.read_text())
        time.sleep(0.5)  # five looks at a folder that is there: the server is left alone
        assert thread.is_alive() and pid_alive(server)
        started = time.monotonic()  # before the removal, which the keeper may see before rmtree returns
        shutil.rmtree(folder)
        thread.join(timeout=15)
        assert not thread.is_alive() and outcome["result"] == 0
        assert not pid_alive(server)
        assert time.monotonic() - started >= 1.0  # SIGTERM was ignored: killed after the grace, not before
        said = capfd.readouterr().err
        assert f"the server's folder {folder} was removed: stopping the server" in said, said
    finally:
        if server and pid_alive(server):
            os.kill(server, 9)
        sock.close()
    freed = socket.socket()
    freed.bind(("127.0.0.1", port))  # no process holds the port any more
    freed.close()
