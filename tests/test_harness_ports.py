"""The servers tests start: ports chosen where outgoing connections never take them, an end with the
process that started them, and the sshd's sessions kept out of the real home."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trialflow.testing import ports
from trialflow.testing.sshd import LoopbackSshd
from trialflow.trial.procs import group_alive


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


def test_each_xdist_worker_picks_ports_from_a_slice_of_its_own(monkeypatch):
    """Two workers of one test run never choose the same port for servers they start at once."""
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    chosen = []
    for worker in ("gw0", "gw1", "gw2", "gw3"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        chosen.append({ports.free_port() for _ in range(30)})
    assert all(ports.LOWEST <= port < ports._ephemeral_start() for picks in chosen for port in picks)
    assert all(not (a & b) for i, a in enumerate(chosen) for b in chosen[i + 1:])
    assert max(chosen[0]) < min(chosen[1]) and max(chosen[2]) < min(chosen[3])


def _taken_first(monkeypatch, taken: int) -> None:
    """``free_port`` hands out ``taken`` once, as when another program chose the same port, then free ones."""
    picks, real = iter([taken]), ports.free_port
    monkeypatch.setattr(ports, "free_port", lambda: next(picks, 0) or real())


def test_a_server_whose_port_is_taken_before_it_binds_starts_on_another(tmp_path, monkeypatch):
    """A port another program binds between the pick and the server's own bind costs a second start,
    not the test: the sshd comes up on another port, and its known_hosts names that one."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        _taken_first(monkeypatch, taken)
        server = LoopbackSshd(tmp_path / "sshd").start()
        try:
            assert server.port != taken
            assert server.known_hosts.read_text().startswith(f"[127.0.0.1]:{server.port} ")
            with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
                assert s.recv(4) == b"SSH-"
        finally:
            server.stop()


@pytest.mark.e2e
@pytest.mark.slurm
def test_a_slurm_cluster_whose_controller_port_is_taken_starts_on_another(tmp_path, monkeypatch):
    """slurmctld's port bound by another program before slurmctld binds it costs a second launch: the
    cluster comes up with its controller on another port, and answers there."""
    from trialflow.testing.slurm import LoopbackSlurm

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        _taken_first(monkeypatch, taken)
        cluster = LoopbackSlurm(tmp_path / "slurm").start()
        try:
            conf = cluster.conf.read_text()
            assert f"SlurmctldPort={taken}\n" not in conf and "SlurmctldPort=" in conf
            assert cluster.run("sinfo", "-h", "-N", "-o", "%T").strip() == "idle"
        finally:
            cluster.stop()


def test_a_prefect_server_whose_port_is_taken_reads_as_taken(tmp_path):
    """Prefect's own words for a port in use are what the harness starts again on: ``prefect server
    start`` on a bound port exits, and waiting for it raises PortTaken, not another error."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        log = tmp_path / "server.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                                     "--port", str(held.getsockname()[1]), "--no-ui"], stdout=out,
                                    stderr=subprocess.STDOUT, env={**os.environ, "PREFECT_HOME": str(tmp_path)})
        try:
            with pytest.raises(ports.PortTaken, match="already in use"):
                ports.wait_serving(lambda: False, proc, log, "prefect server", timeout=120)
        finally:
            proc.kill()
            proc.wait()


def test_an_earlier_launch_s_taken_port_does_not_name_a_later_launch_s_exit(tmp_path):
    """A log appended to across launches (MLflow's keeps a restart's earlier lines): a launch that exits
    for another reason after one whose port was taken is reported as that other exit, not as a taken
    port to start again on."""
    log = tmp_path / "server.log"
    log.write_text("[Errno 98] error while attempting to bind on address: address already in use\n")
    begins = ports.log_size(log)
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit('database is locked')"],
                                stdout=out, stderr=subprocess.STDOUT)
    proc.wait()
    with pytest.raises(RuntimeError, match="database is locked") as raised:
        ports.wait_serving(lambda: False, proc, log, "server", timeout=30, log_from=begins)
    assert not isinstance(raised.value, ports.PortTaken)
    assert "already in use" not in str(raised.value)


def _started_then_killed(starts: str, prints: str, folder: Path, timeout: float) -> tuple[list[int], str]:
    """Run Python that ``starts`` servers in ``folder`` (``sys.argv[1]``), prints the JSON list ``prints``
    names, then SIGKILLs itself, as a test run killed mid-test: (that list, its stderr)."""
    code = ("import json, os, signal, sys\nfrom pathlib import Path\n" + starts +
            f"print(json.dumps({prints}), flush=True)\nos.kill(os.getpid(), signal.SIGKILL)\n")
    done = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, timeout=timeout)
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr[-2000:]


def _gone(groups: list[int], seconds: float) -> bool:
    """Whether every process group in ``groups`` has ended within ``seconds``."""
    deadline = time.monotonic() + seconds
    while any(group_alive(pgid) for pgid in groups) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(group_alive(pgid) for pgid in groups)


@pytest.mark.e2e
def test_a_killed_test_process_leaves_no_prefect_server_nor_worker_behind(tmp_path):
    """The test harness's ``prefect server start`` and the workers spawned against it stop by themselves
    when the process that started them is killed (its fixtures' teardown never runs)."""
    groups, stderr = _started_then_killed(
        "from trialflow.testing.prefect_server import PrefectServer\n"
        "server = PrefectServer(Path(sys.argv[1])).start()\n"
        "worker = server.spawn(['prefect', 'worker', 'start', '--pool', 'check'], Path(sys.argv[1]) / 'w')\n",
        "[server.proc.pid, worker.pid]", tmp_path / "home", timeout=180)
    assert _gone(groups, 60), (groups, stderr)


def test_a_killed_test_process_leaves_no_sshd_listening(tmp_path):
    """The loopback sshd a test starts stops by itself when the process that started it is killed (its
    fixtures' teardown never runs): nothing listens on its port afterwards."""
    (pid, port), stderr = _started_then_killed(
        "from trialflow.testing.sshd import LoopbackSshd\nserver = LoopbackSshd(Path(sys.argv[1])).start()\n",
        "[server.proc.pid, server.port]", tmp_path / "sshd", timeout=60)
    assert _gone([pid], 30), stderr
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_a_session_on_the_loopback_sshd_has_a_home_of_its_own(sshd_servers):
    """A remote trial's ``~`` is the test server's own folder: the commands sshd runs never read the real
    user's shell start-up files (bash reads ``~/.bashrc`` for them) nor write under the real home."""
    server = sshd_servers[0]
    (server.home / ".bashrc").write_text("echo started-up\n")
    try:
        done = subprocess.run(["ssh", "-p", str(server.port), "-i", str(server.key_file), "-o", "BatchMode=yes",
                               "-o", f"UserKnownHostsFile={server.known_hosts}", f"{server.user}@127.0.0.1",
                               'echo "$HOME"; cd ~ && pwd -P'], capture_output=True, text=True, timeout=60)
    finally:
        (server.home / ".bashrc").unlink()
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["started-up", str(server.home), str(server.home.resolve())]
