"""Hostile and broken input, tried on 127.0.0.1 as a careless user or an attacker would: slow and
resetting clients of the metrics receiver, tokens of ended trials, YAML alias bombs, a damaged store,
DNS rebinding against the dashboard, a nested import, tampered code bundles (fuzzed)."""

from __future__ import annotations

import io
import logging
import os
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import base_config, raw_request, wait_for
from tests.test_cli import cli
from tests.test_metrics_receiver import post, record
from trialflow.config import parse_config
from trialflow.experiments import create_experiment
from trialflow.platforms.metrics_receiver import MetricsReceiver
from trialflow.trial.unpack import UnsafeArchiveError, extract_stream

TOKEN = "token-A" * 6


def _receiver(**limits) -> MetricsReceiver:
    receiver = MetricsReceiver(**limits).start()
    receiver.grant(TOKEN, "TrA01")
    return receiver


def _threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name != "MainThread")


def test_half_sent_requests_are_capped_and_cut_after_the_timeout():
    receiver = _receiver(client_timeout=1.0, max_connections=16)
    before = _threads()
    sockets = []
    try:
        for _ in range(64):  # four times the cap
            s = socket.create_connection(("127.0.0.1", receiver.port))
            s.sendall(b"POST /metrics/TrA01 HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le")  # and never more
            sockets.append(s)
        time.sleep(0.3)
        assert _threads() - before <= 16  # not one thread per connection
        # the receiver still answers a well-behaved trial once the slow ones are cut off
        wait_for(lambda: _threads() - before <= 1, timeout=10)
        answer = post(receiver, "TrA01", {"metrics": [record("TrA01", 0)]}, token=TOKEN)
        assert answer.status_code == 200
    finally:
        for s in sockets:
            s.close()
        receiver.stop()


def test_resetting_clients_are_logged_as_one_line_rate_limited(caplog):
    receiver = _receiver()
    caplog.set_level(logging.WARNING, logger="trialflow.metrics")
    try:
        for _ in range(50):
            s = socket.create_connection(("127.0.0.1", receiver.port))
            s.sendall(b"POST /metrics/TrA01 HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{")
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            s.close()  # a reset, mid-body
        time.sleep(0.5)
        assert post(receiver, "TrA01", {"metrics": [record("TrA01", 0)]}, token=TOKEN).status_code == 200
    finally:
        receiver.stop()
    lines = [r.getMessage() for r in caplog.records if r.name == "trialflow.metrics"]
    assert len(lines) <= 2 and all("\n" not in line and "Traceback" not in line for line in lines)


def test_an_ended_trials_token_is_revoked_and_nothing_is_buffered():
    receiver = _receiver()
    try:
        assert post(receiver, "TrA01", {"metrics": [record("TrA01", 0)]}, token=TOKEN).status_code == 200
        receiver.forget("TrA01")  # the trial's end is recorded
        late = post(receiver, "TrA01", {"metrics": [record("TrA01", 1)]}, token=TOKEN)
        assert late.status_code == 410
        assert receiver.drain("TrA01") == []
    finally:
        receiver.stop()


def test_a_trials_unread_metrics_are_bounded_in_bytes():
    receiver = _receiver(max_backlog_bytes=20_000, rate=1e6, burst=1e6)
    try:
        big = "x" * 900
        codes = [post(receiver, "TrA01", {"metrics": [record("TrA01", i, {"default": 1, "pad": big})]},
                      token=TOKEN).status_code for i in range(40)]
        assert codes.count(200) < 25 and codes[-1] == 429
        assert len(receiver.drain("TrA01")) == codes.count(200)
        assert post(receiver, "TrA01", {"metrics": [record("TrA01", 99)]}, token=TOKEN).status_code == 200
    finally:
        receiver.stop()


BOMB = """
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
trialConcurrency: 1
"""


def test_a_yaml_alias_bomb_is_refused_with_one_clear_line(tmp_path):
    path = tmp_path / "bomb.yml"
    path.write_text(BOMB)
    proc = cli("create", "--config", str(path), env={"TRIALFLOW_HOME": str(tmp_path / "home")})
    assert proc.returncode == 1 and "expands to more than 200000 values" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (tmp_path / "home").exists() or not list((tmp_path / "home").iterdir())  # nothing created
    space = tmp_path / "space.yml"
    space.write_text(BOMB.replace("trialConcurrency: 1", "x: {_type: choice, _value: *g}"))
    config = tmp_path / "config.yml"
    config.write_text(f"searchSpaceFile: {space}\ntrialCommand: x\ntrialConcurrency: 1\n"
                      "tuner: {name: Random}\ntrainingService: {platform: local}\n")
    proc = cli("create", "--config", str(config), env={"TRIALFLOW_HOME": str(tmp_path / "home")})
    assert proc.returncode == 1 and "expands to more than" in proc.stdout


@pytest.mark.breaks_records
def test_a_damaged_store_is_one_line_and_listing_and_stopping_skip_it(tmp_path):
    env = {"TRIALFLOW_HOME": str(tmp_path / "w")}
    ids = [create_experiment(parse_config(base_config(tmp_path, tmp_path / "w")))[0] for _ in range(2)]
    damaged = tmp_path / "w" / ids[0] / "db" / "trialflow.sqlite"
    for extra in damaged.parent.glob("trialflow.sqlite-*"):
        extra.unlink()
    damaged.write_bytes(b"\x13garbage" * 512)
    shown = cli("view", ids[0], env=env)
    assert shown.returncode == 1 and len(shown.stdout.strip().splitlines()) == 1
    assert str(damaged) in shown.stdout and "the file is damaged" in shown.stdout and "Traceback" not in shown.stderr
    listing = cli("experiment", "list", "--all", env=env)
    assert listing.returncode == 0 and ids[1] in listing.stdout and f"skipped {ids[0]}" in listing.stdout
    stopped = cli("stop", "--all", env=env)
    assert stopped.returncode == 0 and f"experiment {ids[1]} stopped" in stopped.stdout
    assert f"skipped {ids[0]}" in stopped.stdout


@pytest.mark.parametrize("content, said", [("[" * 100_000 + "]" * 100_000, "is not valid JSON: nested too deeply"),
                                           (b"\xff\xfe[{}]", "is not valid JSON: 'utf-8' codec can't decode")],
                         ids=["nested", "not-utf8"])
def test_an_import_file_nested_too_deeply_or_not_in_utf8_is_one_line(tmp_path, content, said):
    env = {"TRIALFLOW_HOME": str(tmp_path / "w")}
    exp_id, _ = create_experiment(parse_config(base_config(tmp_path, tmp_path / "w")))
    data = tmp_path / "data.json"
    data.write_bytes(content.encode() if isinstance(content, str) else content)
    proc = cli("experiment", "import", exp_id, "-f", str(data), env=env)
    assert proc.returncode == 1 and said in proc.stdout and "Traceback" not in proc.stderr + proc.stdout, proc.stdout
    assert proc.stdout.count("\n") == 1


def test_a_config_search_space_or_update_nested_too_deeply_is_one_line(tmp_path):
    env = {"TRIALFLOW_HOME": str(tmp_path / "w")}
    deep = "[" * 100_000 + "]" * 100_000
    (tmp_path / "deep.json").write_text(deep)
    config = tmp_path / "deep.yml"
    config.write_text(f"trialCommand: x\ntrialConcurrency: 1\nextra: {'[' * 5000}{']' * 5000}\n")
    space = tmp_path / "space.yml"
    space.write_text(f"searchSpaceFile: {tmp_path / 'deep.json'}\ntrialCommand: x\ntrialConcurrency: 1\n"
                     "tuner: {name: Random}\ntrainingService: {platform: local}\n")
    for path in (config, space):
        proc = cli("create", "--config", str(path), env=env)
        assert proc.returncode == 1 and "nests lists or mappings deeper than can be read" in proc.stdout, proc.stdout
        assert "Traceback" not in proc.stdout + proc.stderr
    exp_id, _ = create_experiment(parse_config(base_config(tmp_path, tmp_path / "w")))
    proc = cli("update", "searchspace", exp_id, "-f", str(tmp_path / "deep.json"), env=env)
    assert proc.returncode == 1 and "nests deeper than can be read" in proc.stdout, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_dashboard_answers_only_loopback_host_names_and_its_own_user(tmp_path):
    """A web page rebinding a name to 127.0.0.1, and a second user of a shared machine."""
    pytest.importorskip("optuna_dashboard")
    import optuna

    from trialflow.experiments import open_store
    from trialflow.presentation.dashboard import LiveDashboard, open_mirror

    exp_id, exp_dir = create_experiment(parse_config(base_config(tmp_path, tmp_path / "w")))
    store = open_store(exp_dir.parent, exp_id)
    with LiveDashboard(store, open_mirror(store, optuna.storages.InMemoryStorage())) as dash:
        port = dash.url.split(":")[2].split("/")[0]
        base = f"http://127.0.0.1:{port}/api/studies"
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost"):
            assert requests.get(base, headers={"Host": host}, timeout=10).status_code == 200, host
        for host in (f"attacker.example:{port}", "rebind.attacker.example", f"10.0.0.5:{port}"):
            refused = requests.get(base, headers={"Host": host}, timeout=10)
            assert refused.status_code == 403 and "study" not in refused.text, host
        assert raw_request(int(port), "GET", "/api/studies", user=None).startswith("HTTP/1.0 200")
        assert raw_request(int(port), "GET", "/api/studies") == ""  # the other user: closed unanswered
        assert requests.get(base, timeout=10).status_code == 200  # and it still serves this user


# ---- tampered code bundles (the worker's unpack) -------------------------------------------------

def _tar(*members: tuple[str, str, bytes | str]) -> bytes:
    """A tar stream of (kind, name, data or link target) members; kind in file, dir, sym."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for kind, name, data in members:
            info = tarfile.TarInfo(name)
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind == "sym":
                info.type, info.linkname = tarfile.SYMTYPE, str(data)
                tar.addfile(info)
            else:
                payload = data if isinstance(data, bytes) else data.encode()
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    return out.getvalue()


def _pax_then_file(records: bytes, name: str = "f.txt", data: bytes = b"hello") -> bytes:
    """A hand-made PAX header holding ``records`` (as written, however malformed), then a file."""
    pax = tarfile.TarInfo("././@PaxHeader")
    pax.type, pax.size = tarfile.XHDTYPE, len(records)
    member = tarfile.TarInfo(name)
    member.size = len(data)
    pad = lambda n: b"\0" * (-n % tarfile.BLOCKSIZE)  # noqa: E731
    return (pax.tobuf(tarfile.USTAR_FORMAT) + records + pad(len(records)) + member.tobuf(tarfile.USTAR_FORMAT)
            + data + pad(len(data)) + b"\0" * 2 * tarfile.BLOCKSIZE)


def _unpack(data: bytes, target: Path, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-S", "-m", "trialflow.trial.unpack", str(target)], input=data,
                          capture_output=True, timeout=timeout)


@pytest.mark.parametrize("members,refused", [
    ([("dir", "d", ""), ("sym", "d/up", ".."), ("sym", "esc", "d/up/..")], "through the link 'd/up'"),
    ([("sym", "a", "."), ("sym", "b", "a/a/a/../../.."), ("sym", "p", "b/etc/passwd")], "through the link"),
    ([("sym", "esc", "d/up/.."), ("dir", "d", ""), ("sym", "d/up", "..")], "an earlier link passes through"),
    ([("sym", "x", "y/z"), ("dir", "d", ""), ("sym", "y", "d")], "an earlier link passes through"),
])
def test_chains_of_links_never_lead_out_of_the_bundle(tmp_path, members, refused):
    proc = _unpack(_tar(*members), tmp_path / "t")
    assert proc.returncode == 3 and refused in proc.stderr.decode(), proc.stderr
    assert not (tmp_path / "t").exists()


def test_links_inside_the_bundle_still_work(tmp_path):
    proc = _unpack(_tar(("dir", "d", ""), ("file", "d/a.py", "x = 1\n"), ("sym", "b.py", "d/a.py"),
                        ("sym", "e", "d")), tmp_path / "t")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "t" / "b.py").read_text() == "x = 1\n" and (tmp_path / "t" / "e" / "a.py").is_file()


@pytest.mark.parametrize("records,why", [
    (b"11 size=-5\n", "a PAX size of '-5'"),
    (b"zz path=foo\n", "malformed PAX header record"),
    (b"99999 path=foo\n", "malformed PAX header record"),
    (b"9 path\n", "malformed PAX header record"),
])
def test_malformed_pax_headers_are_one_error_and_never_a_hang(tmp_path, records, why):
    proc = _unpack(_pax_then_file(records), tmp_path / "t", timeout=20)
    err = proc.stderr.decode()
    assert proc.returncode == 3 and why in err and "Traceback" not in err and len(err.splitlines()) == 1, err


def test_the_upload_limits_hold_on_unpack_too(tmp_path):
    proc = _unpack(_tar(*[("file", f"f{i}.py", "") for i in range(2001)]), tmp_path / "t")
    assert proc.returncode == 3 and "more than 2000 files" in proc.stderr.decode()
    huge = tarfile.TarInfo("big.bin")
    huge.size = 301 * 1024 * 1024  # declared only: refused before a byte of it is read
    proc = _unpack(huge.tobuf(tarfile.GNU_FORMAT), tmp_path / "t2")
    assert proc.returncode == 3 and "a bundle holds at most" in proc.stderr.decode()


VALID = _tar(("dir", "pkg", ""), ("file", "pkg/m.py", "print(1)\n"), ("sym", "m.py", "pkg/m.py"),
             ("file", "long/" + "n" * 150 + ".txt", "long name"))


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.binary(min_size=1, max_size=8)), min_size=1,
                max_size=6))
def test_fuzzed_tar_streams_extract_inside_or_are_refused(tmp_path, edits):
    data = bytearray(VALID)
    for pos, chunk in edits:
        data[pos:pos + len(chunk)] = chunk
    work = Path(tempfile.mkdtemp(dir=tmp_path))
    target = work / "box" / "t"
    try:
        extract_stream(io.BytesIO(bytes(data)), str(target))
    except (UnsafeArchiveError, tarfile.TarError):
        assert not target.exists()
    else:
        for path in target.rglob("*"):
            assert os.path.realpath(path).startswith(str(target.resolve()) + os.sep) or not path.exists()
    assert {p.name for p in work.iterdir()} <= {"box"} and {p.name for p in (work / "box").iterdir()} <= {"t"}


# ---- a SIGKILLed controller leaves no temporary Prefect server behind ----------------------------

def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@pytest.mark.e2e
def test_a_sigkilled_controller_leaves_no_temporary_prefect_server(tmp_path):
    from trialflow.experiments import open_store

    code = tmp_path / "code"
    code.mkdir()
    (code / "trial.py").write_text("import time, nni\nnni.get_next_parameter()\ntime.sleep(120)\n")
    exp_id, exp_dir = create_experiment(parse_config(base_config(code, tmp_path / "w", maxTrialNumber=1)))
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}  # Prefect's temporary server
    # called as a flow, the run's server is started by Prefect itself, on a new database, within Prefect's
    # 20 s by default: not enough on a loaded machine (r53)
    env["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "120"
    controller = subprocess.Popen(
        [sys.executable, "-c", "import sys; from trialflow.flows.experiment import experiment_flow; "
         "experiment_flow(None, sys.argv[1], sys.argv[2])", exp_id, str(exp_dir.parent)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        store = open_store(exp_dir.parent, exp_id)
        # a new controller, then its temporary server (allowed 90 s to start) and its first trial: on a
        # loaded machine (r53, beside two busy loops) more than 120 s
        wait_for(lambda: store.trials(["RUNNING"]), timeout=240)
        servers = [p for p in _children(controller.pid) if "prefect.server.api.server:create_app" in _cmdline(p)]
        assert len(servers) == 1
        controller.kill()
        controller.wait()
        wait_for(lambda: not _cmdline(servers[0]), timeout=15)  # gone, by the watchdog
    finally:
        if controller.poll() is None:
            controller.kill()
    # the trial the dead controller left runs on (as a killed controller's trials do); stop it
    cli("stop", exp_id, "--root", str(exp_dir.parent), env={"TRIALFLOW_HOME": str(tmp_path / "w")})


@pytest.mark.e2e
def test_a_controller_sigkilled_while_its_temporary_server_starts_leaves_no_server(tmp_path):
    """The window before the flow runs: the server's process exists, its API does not answer yet."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    controller = subprocess.Popen(
        [sys.executable, "-c", "from trialflow.flows.temporary_server import start_temporary_server; "
         "start_temporary_server(); import time; time.sleep(60)"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        servers: list[int] = []

        def server_started() -> bool:
            servers[:] = [p for p in _children(controller.pid) if "create_app" in _cmdline(p)]
            return bool(servers)

        wait_for(server_started, timeout=60, interval=0.01)
        controller.kill()  # before the server answers: Prefect's start waits seconds for its health
        controller.wait()
        wait_for(lambda: not _cmdline(servers[0]), timeout=15)  # gone, by the watchdog
    finally:
        if controller.poll() is None:
            controller.kill()
        for pid in servers:
            if _cmdline(pid):
                os.kill(pid, 9)


@pytest.mark.e2e
def test_prefect_s_temporary_server_answers_its_own_user_only(tmp_path):
    """It has no auth string: on a shared machine another user could read the experiment's runs and
    logs, and cancel them."""
    script = ("import time\nfrom trialflow.flows.temporary_server import start_temporary_server\n"
              "print(start_temporary_server(), flush=True)\ntime.sleep(120)\n")
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    controller = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  text=True, env={**env, "PREFECT_HOME": str(tmp_path / "prefect")},
                                  start_new_session=True)
    servers: list[int] = []
    try:
        url = controller.stdout.readline().strip()  # type: ignore[union-attr]
        assert url.startswith("http://127.0.0.1:"), url
        port = int(url.split(":")[2].split("/")[0])
        servers[:] = [p for p in _children(controller.pid) if "create_app" in _cmdline(p)]
        asked = ("POST", "/api/flow_runs/filter", "{}")
        assert raw_request(port, *asked) == ""  # the other user: closed unanswered
        mine = raw_request(port, *asked, user=None)
        assert mine.startswith("HTTP/1.1 200"), mine[:300]
        assert "trialflow.server.own_user_only" in _cmdline(servers[0])  # Prefect's server, through it
    finally:
        controller.kill()
        controller.wait()
    wait_for(lambda: not any(_cmdline(p) for p in servers), timeout=15)  # gone with it, by the watchdog


OWNER_DIES_AT_ONCE = """
import os, subprocess, sys
from trialflow.trial.procs import watch_next_child
held = watch_next_child(os.getpid())
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True,
                         pass_fds=(held,))
print(child.pid, flush=True)
os.kill(os.getpid(), 9)  # the worst moment: the child runs, and the parent has done nothing more
"""


def test_a_child_watched_from_before_its_start_goes_when_its_owner_dies_the_moment_it_starts(tmp_path):
    """What a temporary server's start relies on: no moment in which the controller's death leaves it."""
    owner = subprocess.run([sys.executable, "-c", OWNER_DIES_AT_ONCE], capture_output=True, text=True, timeout=60)
    assert owner.returncode == -9, owner.stderr
    child = int(owner.stdout.split()[0])
    try:
        wait_for(lambda: not _cmdline(child) or _state(child) == "Z", timeout=30)
    finally:
        if _cmdline(child):
            os.kill(child, 9)


def _state(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


# ---- fuzzing: YAML anchors and aliases, raw requests to the receiver -----------------------------

@settings(max_examples=60, deadline=5000, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fanout=st.integers(1, 12), depth=st.integers(1, 9), where=st.sampled_from(["top", "space", "service"]))
def test_fuzzed_alias_chains_load_or_are_refused_quickly(tmp_path, fanout, depth, where):
    from trialflow import ConfigError, load_config

    lines = [f"l0: &l0 [{', '.join(['1'] * fanout)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * fanout)}]" for i in range(1, depth)]
    last = f"*l{depth - 1}"
    body = {"top": f"extra: {last}\n", "space": f"searchSpace: {{x: {{_type: choice, _value: {last}}}}}\n",
            "service": f"trainingService: {{platform: local, gpuIndices: {last}}}\n"}[where]
    path = tmp_path / f"c{fanout}-{depth}-{where}.yml"
    path.write_text("\n".join(lines) + "\ntrialCommand: x\ntrialConcurrency: 1\n" + body)
    started = time.monotonic()
    try:
        load_config(path)
    except ConfigError as exc:
        if fanout ** depth > 200_000:
            assert "expands to more than" in str(exc)
    assert time.monotonic() - started < 5


REQUEST_PARTS = st.lists(st.sampled_from([
    b"POST /metrics/TrA01 HTTP/1.1\r\n", b"GET / HTTP/1.0\r\n", b"POST /metrics/../etc HTTP/1.1\r\n",
    b"Host: 127.0.0.1\r\n", f"Authorization: Bearer {TOKEN}\r\n".encode(), b"Authorization: Bearer x\r\n",
    b"Content-Length: 5\r\n", b"Content-Length: -1\r\n", b"Content-Length: 99999999999\r\n",
    b"Transfer-Encoding: chunked\r\n", b"\r\n", b'{"metrics": []}', b"\x00\xff" * 8, b"X" * 70000]) | st.binary(
    max_size=40), max_size=8)


@pytest.fixture(scope="module")
def fuzzed_receiver():
    receiver = MetricsReceiver(client_timeout=0.5).start()
    receiver.grant(TOKEN, "TrA01")
    yield receiver
    receiver.stop()


@settings(max_examples=80, deadline=5000, derandomize=True)
@given(parts=REQUEST_PARTS)
def test_fuzzed_raw_requests_never_break_the_receiver(fuzzed_receiver, parts):
    with socket.create_connection(("127.0.0.1", fuzzed_receiver.port), timeout=5) as s:
        try:
            s.sendall(b"".join(parts))
            s.shutdown(socket.SHUT_WR)
            s.recv(65536)  # an answer or a close, within the receiver's client timeout
        except OSError:
            pass  # reset by the receiver: fine
    answer = post(fuzzed_receiver, "TrA01", {"metrics": [record("TrA01", 10**6)]}, token=TOKEN)
    assert answer.status_code == 200


def test_an_oversized_import_file_is_refused_before_it_is_read(tmp_path):
    env = {"TRIALFLOW_HOME": str(tmp_path / "w")}
    exp_id, _ = create_experiment(parse_config(base_config(tmp_path, tmp_path / "w")))
    data = tmp_path / "huge.json"
    with open(data, "wb") as f:
        f.truncate(65 * 1024 * 1024)  # sparse: its size, not its bytes
    proc = cli("experiment", "import", exp_id, "-f", str(data), env=env)
    assert proc.returncode == 1 and "an import file may hold at most" in proc.stdout
