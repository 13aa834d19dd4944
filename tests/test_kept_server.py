"""trialflow's kept local Prefect server, as a user meets it: no PREFECT_API_URL, `trialflow create`
twice, the printed UI address opened, `trialflow server status|stop`, a controller killed with SIGKILL,
and a refused config that must leave no waiting controller behind."""

from __future__ import annotations

import datetime
import http.server
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.conftest import (
    OTHER_USER,
    as_other_user,
    base_config,
    migrates_on_start,
    nnictl_list_rows,
    only_experiment,
    raw_request,
    signed_in,
    wait_for,
    without_sock_diag,
    write_trial,
)
from trialflow.experiments import open_store
from trialflow.server.kept_server import PLAIN_HTTP_TRUST, ensure_server, running_server, server_home, stop_server
from trialflow.server.kept_server_app import LOOP_SERVICES_DELAY
from trialflow.server.port_keeper import FOLDER_CHECK_SECONDS
from trialflow.server.prefect_db_template import DATABASE_MARK
from trialflow.testing.ports import free_port
from trialflow.trial.procs import pid_alive, stop_with

# each starts Prefect servers of its own: one at a time (one worker), as a user's machine runs them
pytestmark = [pytest.mark.timeout(300), pytest.mark.e2e, pytest.mark.xdist_group("kept_server")]
PAGE = re.compile(r"Prefect UI: (http://127\.0\.0\.1:(\d+)/v2/runs/flow-run/([0-9a-f-]{36}))")  # the UI it opens


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    return {**env, "TRIALFLOW_HOME": str(home), "TRIALFLOW_PREFECT_SERVER": "kept", "COLUMNS": "200", **extra}


# what the installed `trialflow` command runs (it starts the server and a background controller before
# the CLI's imports); `python -m trialflow.cli` starts them from the CLI
CONSOLE_SCRIPT = [sys.executable, "-c", "import sys; sys.argv[0] = 'trialflow'; "
                  "from trialflow.console_script import main; main()"]
MODULE = [sys.executable, "-m", "trialflow.cli"]


def _cli(home: Path, *args: str, entry: list[str] = CONSOLE_SCRIPT, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*entry, *args], capture_output=True, text=True, env=_env(home, **env), timeout=180)


QUICK = "import nni\nnni.get_next_parameter()\nnni.report_final_result(1)\n"


def _config(tmp_path: Path, name: str, trial: str = QUICK, **overrides) -> Path:
    write_trial(tmp_path / f"code-{name}", trial)
    path = tmp_path / f"{name}.yml"
    overrides = {"maxTrialNumber": 2, **overrides}
    path.write_text(yaml.safe_dump(base_config(tmp_path / f"code-{name}", tmp_path / "w", experimentName=name,
                                               **overrides)))
    return path


def _held_config(tmp_path: Path, name: str, trials: int, then: str = "") -> tuple[Path, Path]:
    """A file ``hold`` (made) and the config of ``trials`` trials that wait while it exists, then run
    ``then`` and report 1."""
    hold = tmp_path / "hold"
    hold.touch()
    held = (f"import os, time, nni\nnni.get_next_parameter()\nwhile os.path.exists({str(hold)!r}):\n"
            f"    time.sleep(0.1)\n{then}nni.report_final_result(1)\n")
    return hold, _config(tmp_path, name, held, maxTrialNumber=trials)


@pytest.fixture
def home(tmp_path):
    """A TRIALFLOW_HOME whose kept server is stopped after the test, and with the test session if it dies."""
    home = tmp_path / "home"
    yield home
    stop_server(home)


def _guard(home: Path) -> None:
    server = running_server(home)
    if server is not None:
        stop_with(os.getpid(), server.pid)  # a killed test session must not leave it running


def _get(url: str, server) -> tuple[int, bytes]:
    """GET as a browser asks (the UI answers deep links with its page for HTML requests only), signed in."""
    request = urllib.request.Request(url, headers={"Accept": "text/html", **signed_in(server)})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status, response.read()


def _final_task_runs(server, flow_run_id: str) -> set[str]:
    """Names of the flow run's task runs in a final state, as the server has them."""
    body = json.dumps({"flow_runs": {"id": {"any_": [flow_run_id]}}}).encode()
    request = urllib.request.Request(f"{server.url}/task_runs/filter", data=body, method="POST",
                                     headers={"Content-Type": "application/json", **signed_in(server)})
    with urllib.request.urlopen(request, timeout=10) as response:
        runs = json.loads(response.read())
    return {r["name"] for r in runs if r["state_type"] in ("COMPLETED", "FAILED", "CANCELLED", "CRASHED")}


def test_the_kept_server_starts_once_serves_two_experiments_and_server_stop_stops_it(tmp_path, home):
    first = _cli(home, "create", "--config", str(_config(tmp_path, "one")))
    assert first.returncode == 0, first.stdout + first.stderr
    _guard(home)
    server = running_server(home)
    assert server is not None
    second = _cli(home, "create", "--config", str(_config(tmp_path, "two")))
    assert second.returncode == 0, second.stdout + second.stderr
    assert running_server(home) == server  # reused: the same process, not a second server
    for out in (first.stdout, second.stdout):
        page, port, flow_run_id = PAGE.search(out).groups()
        assert int(port) == server.port
        assert f"(its login page asks for the auth string in {server_home(home) / 'auth'})" in out
        status, body = _get(page, server)  # the address create printed answers with Prefect's UI
        assert status == 200 and b"<html" in body.lower()
        status, body = _get(f"{server.url}/flow_runs/{flow_run_id}", server)
        exp_id = out.split("experiment id: ")[1].split()[0]
        assert status == 200 and json.loads(body)["name"] == exp_id
        store = open_store(tmp_path / "w", exp_id)
        wait_for(lambda store=store: store.experiment().status == "DONE", timeout=120)
        assert store.experiment().prefect_api == server.url
        # task-run states reach the server as events, which it writes in batches: each trial's three
        # task runs are there, final, within seconds
        expected = {f"{kind}-{t.id}" for t in store.trials() for kind in ("submit", "trial")}
        wait_for(lambda f=flow_run_id, e=expected: e <= _final_task_runs(server, f), timeout=30)
    status = _cli(home, "server", "status")
    assert status.returncode == 0 and f"UI http://127.0.0.1:{server.port}" in status.stdout
    stopped = _cli(home, "server", "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert not pid_alive(server.pid, server.start_time)
    after = _cli(home, "server", "status")
    assert after.returncode == 1 and "not running" in after.stdout


SLEEPER = "import nni, time\nnni.get_next_parameter()\ntime.sleep(60)\n"


def _create_sleeper(tmp_path: Path, home: Path, name: str, trials: int) -> tuple[str, str]:
    """``trialflow create`` (background) of trials that sleep a minute: what it printed, and the id."""
    created = _cli(home, "create", "--config", str(_config(tmp_path, name, SLEEPER, maxTrialNumber=trials)))
    assert created.returncode == 0, created.stdout + created.stderr
    _guard(home)
    return created.stdout, created.stdout.split("experiment id: ")[1].split()[0]


def test_a_ctrl_c_to_the_command_never_reaches_its_background_controller(tmp_path, home):
    """`create` run as a terminal runs it (the leader of its session and foreground group): its controller
    has a process group of its own, so the terminal's Ctrl-C (SIGINT to that group) reaches nothing of the
    experiment, and stays in the command's session (the scheduler counts both as one while they start)."""
    config = _config(tmp_path, "interrupted", SLEEPER, maxTrialNumber=1)
    command = subprocess.Popen([*CONSOLE_SCRIPT, "create", "--config", str(config)], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env=_env(home), start_new_session=True)
    printed, _ = command.communicate(timeout=180)
    _guard(home)
    assert command.returncode == 0, printed
    controller = int(re.search(r"in the background \(pid (\d+)\)", printed).group(1))
    exp_id = printed.split("experiment id: ")[1].split()[0]
    assert os.getpgid(controller) == controller and os.getsid(controller) == command.pid
    with pytest.raises(ProcessLookupError):  # no process of the experiment is left in the terminal's group
        os.killpg(command.pid, signal.SIGINT)
    store = open_store(tmp_path / "w", exp_id)
    wait_for(lambda: store.trials(["RUNNING"]), timeout=120)
    assert pid_alive(controller)
    assert _cli(home, "stop", exp_id).returncode == 0


def test_server_stop_refuses_while_an_experiment_reports_to_it(tmp_path, home):
    _, exp_id = _create_sleeper(tmp_path, home, "long", 1)
    refused = _cli(home, "server", "stop")
    assert refused.returncode == 1
    assert refused.stderr.strip() == "" and refused.stdout.strip() == (
        f"error: experiment(s) {exp_id} report to this server: stop them first, or --force")
    assert running_server(home) is not None
    assert _cli(home, "stop", exp_id).returncode == 0


def test_resume_in_the_background_prints_the_page_of_its_new_flow_run(tmp_path, home):
    created, exp_id = _create_sleeper(tmp_path, home, "again", 3)
    first_run = PAGE.search(created).group(3)
    assert _cli(home, "stop", exp_id).returncode == 0
    resumed = _cli(home, "resume", exp_id, "--root", str(tmp_path / "w"))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    page, _, resumed_run = PAGE.search(resumed.stdout).groups()
    assert resumed_run != first_run  # the stopped run's page would show none of the resumed trials
    assert resumed_run == open_store(tmp_path / "w", exp_id).experiment().flow_run_id
    server = running_server(home)
    assert server is not None
    status, body = _get(f"{server.url}/flow_runs/{resumed_run}", server)
    assert status == 200 and json.loads(body)["name"] == exp_id
    assert _get(page, server)[0] == 200
    assert _cli(home, "stop", exp_id).returncode == 0


def test_a_configured_api_that_does_not_answer_is_one_line_and_resume_runs_the_experiment_later(tmp_path, home):
    dead = f"http://127.0.0.1:{free_port()}/api"  # a loopback port nothing listens on
    path = _config(tmp_path, "unreached")
    ids = []
    for mode in ([], ["--foreground"]):
        refused = _cli(home, "create", "--config", str(path), *mode, PREFECT_API_URL=dead)
        exp_id = refused.stdout.split("experiment id: ")[1].split()[0]
        ids.append(exp_id)
        why = (f"the Prefect API at {dead} (PREFECT_API_URL) does not answer ([Errno 111] Connection refused): "
               "start that server, or unset PREFECT_API_URL to report to trialflow's local Prefect server")
        assert refused.returncode == 1 and refused.stderr == ""  # no traceback
        assert refused.stdout.splitlines()[-1] == (f"error: experiment {exp_id} "
                                                   f"{'could not run' if mode else 'ended at once (ERROR)'}: {why}")
        record = open_store(tmp_path / "w", exp_id).experiment()
        assert (record.status, record.message) == ("ERROR", why)  # kept, with the reason
    assert running_server(home) is None  # a configured API is used as it is: no local server instead
    resumed = _cli(home, "resume", ids[0], "--root", str(tmp_path / "w"), "--foreground")  # the API unset
    _guard(home)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    store = open_store(tmp_path / "w", ids[0])
    assert store.experiment().status == "DONE" and [t.status for t in store.trials()] == ["SUCCEEDED"] * 2


# listens on a loopback port as another user would who took it, and says what each connection sent
SQUATTER = """use Socket; socket(my $s, PF_INET, SOCK_STREAM, 0) or die; setsockopt($s, SOL_SOCKET, SO_REUSEADDR, 1);
bind($s, pack_sockaddr_in($ARGV[0], inet_aton("127.0.0.1"))) or die "bind: $!"; listen($s, 50) or die; $| = 1;
print "listening\\n"; while (accept(my $c, $s)) { my $b = ""; sysread($c, $b, 65536);
print "heard ", length($b), " bytes", ($b =~ /Authorization/i ? " with the auth string" : ""), "\\n"; close($c) }"""


def test_a_forced_server_stop_mid_run_lets_the_experiment_go_on_telling_one_who_takes_the_port_nothing(
        tmp_path, home):
    """With no server, and no keeper holding its port, a second user of the machine takes it: the
    controllers that still call it, and a `prefect` command of a shell pointed at the server with
    `server env`, make no connection to that user's program."""
    # Prefect's client retries a refused call three times here, without jitter (2 + 4 + 8 s of back-off;
    # by default five times, 62 s, each wait +-20 %). A stall per cancel check, or minutes of undeliverable
    # events at exit, then far exceed the bounds below, while a busy machine's own slowness stays under them.
    # The trials wait until the API's absence has been noticed (a busy machine may look at the run's state
    # seconds apart), then take 1 s each.
    hold, path = _held_config(tmp_path, "orphaned", 6, then="time.sleep(1)\n")
    # a port of its own: another test worker's server, preferring 4200, could take that one once it is free
    assert _cli(home, "server", "start", "--port", str(free_port())).returncode == 0
    created = _cli(home, "create", "--config", str(path), PREFECT_CLIENT_MAX_RETRIES="3",
                   PREFECT_CLIENT_RETRY_JITTER_FACTOR="0")
    assert created.returncode == 0, created.stdout + created.stderr
    _guard(home)
    exp_id = created.stdout.split("experiment id: ")[1].split()[0]
    controller = int(re.search(r"in the background \(pid (\d+)\)", created.stdout).group(1))
    store = open_store(tmp_path / "w", exp_id)
    wait_for(lambda: any(t.status == "RUNNING" for t in store.trials()), timeout=60)
    port = running_server(home).port
    shell_line = _cli(home, "server", "env").stdout.strip()  # what the user's shell evaluated
    assert _cli(home, "server", "stop", "--force").returncode == 0
    as_other_user("true")  # the user exists
    squatter = subprocess.Popen(["runuser", "-u", OTHER_USER, "--", "perl", "-e", SQUATTER, str(port)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        assert squatter.stdout.readline() == "listening\n"
        _the_experiment_goes_on(tmp_path, hold, store, exp_id, controller, port)
        # Prefect's own command, in that shell, knows nothing of trialflow but the environment
        prefect = subprocess.run(["bash", "-c", 'eval "$1" && exec prefect work-pool ls', "-", shell_line],
                                 capture_output=True, text=True, env=_env(home), timeout=120)
        assert prefect.returncode != 0
        assert f"port {port} of trialflow's local Prefect server is held by another user" in prefect.stderr, \
            prefect.stdout[-2000:] + prefect.stderr[-2000:]
    finally:
        os.killpg(squatter.pid, signal.SIGKILL)  # runuser and the other user's program under it
    heard = squatter.communicate()[0]
    assert heard == "", heard[:2000]  # not one connection


def test_any_python_of_a_shell_pointed_at_the_server_guards_its_port_from_its_start():
    """The line `server env` exports (TRIALFLOW_GUARD_PORT) makes every interpreter of trialflow's
    environment guard that port from its start, before any of the program's own code: a plain urllib
    call makes no connection to another user's listener there. A malformed value is one line, and
    the interpreter runs on."""
    port = free_port()
    as_other_user("true")  # the user exists
    squatter = subprocess.Popen(["runuser", "-u", OTHER_USER, "--", "perl", "-e", SQUATTER, str(port)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    call = f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{port}/api/health', timeout=10)"
    try:
        assert squatter.stdout.readline() == "listening\n"
        guarded = subprocess.run([sys.executable, "-c", call], capture_output=True, text=True, timeout=60,
                                 env={**os.environ, "TRIALFLOW_GUARD_PORT": f"127.0.0.1:{port}"})
    finally:
        os.killpg(squatter.pid, signal.SIGKILL)
    heard = squatter.communicate()[0]
    assert heard == "", heard[:2000]
    assert guarded.returncode == 1 and "ConnectionRefusedError" in guarded.stderr
    uid = int(as_other_user("id", "-u").stdout)
    assert guarded.stderr.startswith(f"trialflow: port {port} of trialflow's local Prefect server is held by another "
                                     f"user (uid {uid}), not by the server: not connecting to it"), guarded.stderr
    malformed = subprocess.run([sys.executable, "-c", "print('ran')"], capture_output=True, text=True, timeout=60,
                               env={**os.environ, "TRIALFLOW_GUARD_PORT": "localhost"})
    assert (malformed.returncode, malformed.stdout) == (0, "ran\n")
    assert malformed.stderr.splitlines() == ["trialflow: TRIALFLOW_GUARD_PORT='localhost' is not HOST:PORT[,HOST:PORT"
                                             '...]: no port is guarded; unset it, or run eval "$(trialflow server '
                                             'env)" again']


def _the_experiment_goes_on(tmp_path: Path, hold: Path, store, exp_id: str, controller: int, port: int) -> None:
    """It runs its trials to the end without the server, and its controller ends, saying why."""
    log_file = tmp_path / "w" / exp_id / "log" / "experiment.log"
    said = "the cancel check: a call to the Prefect API failed"
    wait_for(lambda: said in log_file.read_text(), timeout=60)
    hold.unlink()
    released = time.monotonic()
    # six 1 s trials two at a time: ~3 s of trials (5 s seen idle, 14 s beside five busy test processes); a
    # 14 s stall at every look at the run's state would make each of the three pairs wait first: 42 s at least
    wait_for(lambda: store.experiment().status == "DONE", timeout=90)
    assert time.monotonic() - released < 30
    assert [t.status for t in store.trials()] == ["SUCCEEDED"] * 6
    assert log_file.read_text().count(said) == 1  # said once, not at every look while the API was gone
    # its final state's call is tried once (its calls found the API gone); what Prefect queued (~40
    # events) is then given 10 s, not 15 s per event: ~15 s (a minute and more with Prefect's retries)
    done = time.monotonic()
    wait_for(lambda: not pid_alive(controller), timeout=150, interval=0.5)
    assert time.monotonic() - done < 120
    output = (tmp_path / "w" / exp_id / "log" / "controller.out").read_text()
    uid = int(as_other_user("id", "-u").stdout)
    assert f"the Prefect API does not answer ([Errno 111] port {port} of trialflow's local Prefect server is held " \
           f"by another user (uid {uid}), not by the server: not connecting to it" in output, output[-3000:]


class ErrorAnswers(http.server.ThreadingHTTPServer):
    """Another program of the user, on a port it took: answers every request with one HTTP error status
    and keeps each request's line. Serves from :meth:`start` until :meth:`shutdown`."""

    def __init__(self, port: int, status: int) -> None:
        self.answered: list[str] = []
        answers = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # kept-alive connections, as Prefect's client keeps them

            def handle_one_request(self) -> None:
                self.raw_requestline = self.rfile.readline(65537)
                if not self.raw_requestline or not self.parse_request():
                    self.close_connection = True
                    return
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                answers.answered.append(self.requestline)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", port), Handler)

    def start(self) -> None:
        threading.Thread(target=self.serve_forever, daemon=True).start()


def test_a_run_whose_port_another_program_took_tries_its_final_state_once_and_says_so_in_one_line(tmp_path, home):
    """After a forced `server stop` mid-run, another program of the user takes the port and answers 503
    to every request (what Prefect's client retries with back-off, a minute by default). A foreground
    run whose own calls found its API failing tries the engine's final state once; the terminal gets
    the outcome and one line naming that call, no traceback; the record is DONE."""
    hold, path = _held_config(tmp_path, "taken", 1)
    assert _cli(home, "server", "start", "--port", str(free_port())).returncode == 0
    _guard(home)
    port = running_server(home).port
    # without the one try, two more after 2 and 4 s (Prefect's default: five, with jitter)
    env = _env(home, PREFECT_CLIENT_MAX_RETRIES="2", PREFECT_CLIENT_RETRY_JITTER_FACTOR="0", COLUMNS="300")
    proc = subprocess.Popen([*CONSOLE_SCRIPT, "create", "--config", str(path), "--foreground"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    taken = None
    try:
        try:
            exp_id = next(x for x in proc.stdout if "experiment id: " in x).split("experiment id: ")[1].split()[0]
            store = open_store(tmp_path / "w", exp_id)
            wait_for(lambda: [t.status for t in store.trials()] == ["RUNNING"], timeout=120)
            assert _cli(home, "server", "stop", "--force").returncode == 0
            taken = ErrorAnswers(port, 503)
            taken.start()
            log = tmp_path / "w" / exp_id / "log" / "experiment.log"
            wait_for(lambda: "the cancel check: a call to the Prefect API failed" in log.read_text(), timeout=60)
        finally:
            hold.unlink()
        out = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:  # a failed step above: the run is not left behind
            proc.kill()
            proc.communicate()
        if taken is not None:
            taken.shutdown()
            taken.server_close()
    assert proc.returncode == 1, out[-3000:]
    assert store.experiment().status == "DONE" and [t.status for t in store.trials()] == ["SUCCEEDED"]
    final_state = f"/api/flow_runs/{store.experiment().flow_run_id}/set_state"
    assert taken.answered.count(f"POST {final_state} HTTP/1.1") == 1, taken.answered
    lines = out.splitlines()
    assert "Traceback" not in out, out[-3000:]
    assert "1 trial: 1 SUCCEEDED" in lines and any(x.startswith("best trial ") for x in lines), out[-3000:]
    failed = f"the Prefect API answered POST http://127.0.0.1:{port}{final_state} with 503 Service Unavailable"
    # and Prefect's undeliverable events are given 10 s, not their retries at exit (26 s)
    assert lines[-2:] == [f"error: experiment {exp_id}: {failed}", "the Prefect API failed a call: what is left of "
                          "this run's events and logs is dropped after 10 s"], out[-3000:]


def test_a_script_whose_api_went_away_gets_its_result_and_ends_without_minutes_of_retries(tmp_path, home):
    """By hand: a script calling ``run_experiment``, the kept server stopped (``--force``) mid-run. The
    experiment ended DONE, but the script died with the final state's ConnectError, then spent minutes
    at exit logging each event Prefect could not send. It now gets the result, one warning naming the
    failed call and no traceback, and ends after the 10 s given to what Prefect queued for that API."""
    hold, path = _held_config(tmp_path, "script", 3)  # two held, the third after the stop: ~25 events
    assert _cli(home, "server", "start", "--port", str(free_port())).returncode == 0
    _guard(home)
    port = running_server(home).port
    script = tmp_path / "run.py"
    script.write_text(f"import trialflow\nresult = trialflow.run_experiment({str(path)!r})\n"
                      "print('returned', result.experiment_id, result.status, result.best_value)\n")
    proc = subprocess.Popen([sys.executable, str(script)], env=_env(home), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        try:
            runs = tmp_path / "w"

            def two_running() -> str | None:
                found = only_experiment(runs)
                return found[0] if found and [t.status for t in found[1]] == ["RUNNING"] * 2 else None

            exp_id = wait_for(two_running, timeout=120)
            store = open_store(runs, exp_id)
            assert _cli(home, "server", "stop", "--force").returncode == 0
            log = runs / exp_id / "log" / "experiment.log"
            wait_for(lambda: "the cancel check: a call to the Prefect API failed" in log.read_text(), timeout=60)
        finally:
            hold.unlink()
        out = proc.communicate(timeout=60)[0]  # Prefect's client alone tries each event for ~7 s
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out[-3000:]
    assert f"returned {exp_id} DONE 1.0" in out.splitlines(), out[-3000:]
    assert "Traceback" not in out, out[-3000:]  # Prefect's engine's record of the failed call is left out
    assert store.experiment().status == "DONE"
    set_state = f"http://127.0.0.1:{port}/api/flow_runs/{store.experiment().flow_run_id}/set_state"
    assert (f"experiment {exp_id} ended DONE, but the Prefect API did not answer POST {set_state}: ConnectError: "
            "[Errno 111] Connection refused: what is left of its run's events and logs there is dropped after "
            "10 s") in out, out[-3000:]


def _processes_of(home: Path, *marks: bytes) -> list[int]:
    """Pids of processes started with this TRIALFLOW_HOME whose command line holds one of ``marks``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(mark in cmdline for mark in marks) and f"TRIALFLOW_HOME={home}".encode() in environ:
            found.append(int(entry))
    return found


def _servers_of(home: Path) -> list[int]:
    """Pids of Prefect servers started with this TRIALFLOW_HOME (kept or temporary), each the leader of
    its session (the kept server's keeper, not the process it runs)."""
    return [pid for pid in _processes_of(home, b"server start", b"create_app", b"trialflow.server.kept_server_app")
            if _session_of(pid) == pid]


def _session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except ProcessLookupError:  # ended meanwhile
        return None


def test_a_sigkilled_controller_leaves_the_kept_server_and_no_server_of_its_own(tmp_path, home):
    # a port of its own: on 4200, which other test workers' servers prefer, one of them could start
    # between the stop and the revival below, and the revival would move
    assert _cli(home, "server", "start", "--port", str(free_port())).returncode == 0
    created, exp_id = _create_sleeper(tmp_path, home, "killed", 1)
    controller = int(re.search(r"in the background \(pid (\d+)\)", created).group(1))
    store = open_store(tmp_path / "w", exp_id)
    wait_for(lambda: store.trials(["RUNNING"]), timeout=120)
    server = running_server(home)
    assert _servers_of(home) == [server.pid]
    os.kill(controller, signal.SIGKILL)
    wait_for(lambda: not pid_alive(controller), timeout=10)
    time.sleep(1.0)
    assert _servers_of(home) == [server.pid] and server.healthy()  # kept for the next experiment
    flow_run_id = store.experiment().flow_run_id
    assert _cli(home, "server", "stop", "--force").returncode == 0  # the dead controller's run says RUNNING
    # its trial ran on; `stop` cancels it and, starting the kept server again, puts its run in Cancelled
    assert _cli(home, "stop", exp_id).returncode == 0
    revived = running_server(home)
    assert revived is not None and revived.port == server.port
    status, body = _get(f"{revived.url}/flow_runs/{flow_run_id}", revived)
    assert json.loads(body)["state"]["type"] == "CANCELLED"


@pytest.mark.parametrize("entry", [CONSOLE_SCRIPT, MODULE], ids=["console-script", "module"])
def test_a_refused_config_leaves_no_waiting_controller(tmp_path, home, entry):
    bad = tmp_path / "bad.yml"
    bad.write_text(yaml.safe_dump({"trialCommand": "python3 trial.py", "trainingService": {"platform": "local"},
                                   "trialConcurency": 2}))
    proc = _cli(home, "create", "--config", str(bad), entry=entry)
    assert proc.returncode == 1
    assert proc.stdout.startswith("error: Invalid experiment config")
    assert "did you mean 'trialConcurrency'" in proc.stdout
    waiting = _processes_of(home, b"trialflow.app.controller_launch")
    deadline = time.monotonic() + 10
    while waiting and time.monotonic() < deadline:
        time.sleep(0.1)
        waiting = _processes_of(home, b"trialflow.app.controller_launch")
    _guard(home)  # the controller may have started the server already: it is kept for the next create
    assert not waiting  # the controller started beside the config check ended with it


def test_a_restart_with_the_same_prefect_skips_the_migration_check_and_another_version_runs_it(home):
    """A cold start (server stopped, database kept) skips Prefect's migration check when the database
    was last served by the same Prefect version; a database last served by another version is migrated.
    (A new database's first start: tests/test_prefect_db_template.py.)"""
    first = ensure_server(home, port=0)
    _guard(home)
    stop_server(home)
    again = ensure_server(home, port=0)
    _guard(home)
    assert again.port == first.port and not migrates_on_start(again)
    flows = urllib.request.Request(f"{again.url}/flows/filter", data=b"{}", method="POST",
                                   headers={"Content-Type": "application/json", **signed_in(again)})
    with urllib.request.urlopen(flows, timeout=10) as response:  # the database serves as before
        assert response.status == 200
    stop_server(home)
    (server_home(home) / DATABASE_MARK).write_text(json.dumps({"prefect": "3.0.0"}))  # as after an upgrade
    upgraded = ensure_server(home, port=0)
    _guard(home)
    assert migrates_on_start(upgraded)
    assert json.loads((server_home(home) / DATABASE_MARK).read_text())["prefect"] == upgraded.prefect


def _log_times(log: str, mark: str) -> list[datetime.datetime]:
    """When the server's log (Prefect's format, "HH:MM:SS.fff | LEVEL | logger - message") says ``mark``."""
    return [datetime.datetime.strptime(line[:12], "%H:%M:%S.%f") for line in log.splitlines() if mark in line]


def _seconds_between(earlier: datetime.datetime, later: datetime.datetime) -> float:
    """Seconds from one time of day in the log to a later one (the log's times may pass midnight)."""
    gap = (later - earlier).total_seconds()
    return gap + 86400 if gap < -43200 else gap


def test_prefects_loop_services_run_seconds_after_the_server_starts_and_a_stop_before_then_is_clean(
        home, monkeypatch):
    """A run overdue at its scheduled time is still marked Late by Prefect's loop services, which are
    scheduled LOOP_SERVICES_DELAY after the server's start-up (so the first experiment's requests have
    the cores); a server stopped before then stops cleanly, with no loop service scheduled. (The first
    part's log may hold Prefect's own "database is locked" from its late-run monitor, whose writes meet
    other services' on SQLite and are tried again at its next step: so it was before the delay.)"""
    monkeypatch.setenv("PREFECT_LOGGING_SERVER_LEVEL", "INFO")  # Prefect's "Scheduling perpetual service"
    monkeypatch.setenv("PREFECT_SERVER_LOGGING_LEVEL", "info")  # uvicorn's "Application startup complete"
    log = server_home(home) / "server.log"
    server = ensure_server(home, port=0)
    _guard(home)
    headers = signed_in(server)
    _, flow = _post(f"{server.url}/flows/", {"name": "overdue"}, headers)
    an_hour_ago = (datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=1)).isoformat()
    status, run = _post(f"{server.url}/flow_runs/", {"flow_id": flow["id"], "state": {
        "type": "SCHEDULED", "name": "Scheduled", "state_details": {"scheduled_time": an_hour_ago}}}, headers)
    assert status == 201, run

    def state() -> str:
        request = urllib.request.Request(f"{server.url}/flow_runs/{run['id']}", headers=headers)
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())["state_name"]

    wait_for(lambda: state() == "Late", timeout=60)
    started = _log_times(log.read_text(), "Application startup complete")
    scheduled = _log_times(log.read_text(), "Scheduling perpetual service")
    assert len(started) == 1 and scheduled
    assert _seconds_between(started[0], min(scheduled)) >= LOOP_SERVICES_DELAY - 0.01
    stop_server(home)

    ensure_server(home, port=0)  # and at once stopped again
    _guard(home)
    stop_server(home)
    text = log.read_text()
    second = text[text.rindex("\n", 0, text.rindex("Application startup complete")) + 1:]  # the last start's lines
    assert "Application shutdown complete" in second
    stopped_after = _seconds_between(_log_times(second, "Application startup complete")[0],
                                     _log_times(second, "Shutting down")[0])
    if stopped_after < LOOP_SERVICES_DELAY - 0.01:  # as it is unless a loaded machine held the stop back
        assert "Scheduling perpetual service" not in second
    assert "Traceback" not in second and "| ERROR" not in second


def test_the_port_is_the_servers_from_its_choice_on_and_a_taken_one_moves_it(home):
    """Nothing can take the server's port while it starts (its import takes seconds; another program
    binding the port meanwhile made it exit with no output), and a port someone else holds is not used."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    try:
        server = ensure_server(home, wait=False, port=taken)
        _guard(home)
        assert server.port != taken
        with socket.socket() as late, pytest.raises(OSError):
            late.bind(("127.0.0.1", server.port))  # what another program would do before the server listens
        assert server.wait_until_healthy() is server
    finally:
        holder.close()


def test_another_user_of_the_machine_reaches_no_secret_run_or_database_of_the_kept_server():
    """A shared login node: a second Unix user (who may have learnt the auth string: a controller
    sends it to whoever holds the port while the server is down), and a web page in a browser."""
    from prefect.blocks.system import Secret
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

    home = Path(tempfile.mkdtemp(prefix="trialflow-shared-home-", dir="/tmp"))
    home.chmod(0o755)  # a home others may enter, as most are
    try:
        server = ensure_server(home, port=0)
        _guard(home)
        with temporary_settings(updates={PREFECT_API_URL: server.url, PREFECT_API_AUTH_STRING: server.auth}):
            Secret(value="s3cret-pass-7").save("mine")  # what the README says to keep in blocks
        secrets_asked = ("POST", "/api/block_documents/filter", '{"include_secrets": true}')
        for headers in ({}, signed_in(server)):  # the other user, without and with the auth string
            assert raw_request(server.port, *secrets_asked, **headers) == ""
            assert raw_request(server.port, "POST", "/api/flow_runs/filter", "{}", **headers) == ""
        other_uid = int(as_other_user("id", "-u").stdout)
        said = (server_home(home) / "server.log").read_text()
        assert said.count(f"refused a connection: its client is uid {other_uid}, not this") == 1, said[-2000:]
        # this user's own programs without the string, and a web page in this user's browser
        stolen = raw_request(server.port, *secrets_asked, user=None)
        assert stolen.startswith("HTTP/1.1 401") and "s3cret-pass-7" not in stolen, stolen[:300]
        assert raw_request(server.port, "POST", "/api/logs/filter", "{}", user=None).startswith("HTTP/1.1 401")
        rebound = raw_request(server.port, "GET", "/api/health", user=None, Host="rebound.example:80")
        assert rebound.startswith("HTTP/1.1 421"), rebound[:300]
        preflight = raw_request(server.port, "OPTIONS", "/api/flow_runs/filter", user=None,
                                 Origin="http://evil.example", Access_Control_Request_Method="POST")
        assert preflight.startswith("HTTP/1.1 ") and "evil.example" not in preflight.lower()
        assert "access-control-allow-origin: *" not in preflight.lower()
        folder = server_home(home)
        for private in (folder / "prefect" / "prefect.db", folder / "auth"):
            assert private.exists() and as_other_user("cat", str(private)).returncode != 0, private
        assert (folder.stat().st_mode & 0o777, (folder / "auth").stat().st_mode & 0o777) == (0o700, 0o600)
        signed = urllib.request.Request(f"{server.url}/block_documents/filter", data=b'{"include_secrets": true}',
                                        method="POST", headers={"Content-Type": "application/json",
                                                                **signed_in(server)})
        with urllib.request.urlopen(signed, timeout=10) as response:  # the user who started it still can
            assert b"s3cret-pass-7" in response.read()
    finally:
        stop_server(home)
        shutil.rmtree(home, ignore_errors=True)


def _served_by(server) -> int:
    """The pid of the process in the kept ``server``'s session that runs its app."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            app = argv[1:3] == [b"-m", b"trialflow.server.kept_server_app"]
            if entry.isdigit() and app and os.getsid(int(entry)) == server.pid:
                found.append(int(entry))
        except (OSError, ValueError):
            continue
    assert len(found) == 1, found
    return found[0]


# binds and listens on a loopback port as uvicorn does (SO_REUSEADDR), in perl-base (in every Debian):
# the other user may not run this user's Python
BIND = ("perl -MSocket -e 'socket(my $s, PF_INET, SOCK_STREAM, 0) or die; "
        "setsockopt($s, SOL_SOCKET, SO_REUSEADDR, 1); print((bind($s, pack_sockaddr_in($ARGV[0], "
        "inet_aton(\"127.0.0.1\"))) && listen($s, 5)) ? \"bound\\n\" : \"$!\\n\")'")


def _bind_as_other_user(port: int) -> str:
    """What binding ``port`` on loopback gets another user of the machine: "bound" or the error."""
    return as_other_user("bash", "-c", f"{BIND} {port}").stdout.strip()


def test_a_server_that_dies_unasked_is_back_on_its_port_which_no_one_else_takes_meanwhile(home):
    """The OOM killer's SIGKILL: while the server is down, another user of the machine could answer its
    controllers and its open UI tabs, had its port become free."""
    server = ensure_server(home, port=0)
    _guard(home)
    first = _served_by(server)
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: not pid_alive(first), timeout=10)
    # the port stays taken for every other program, SO_REUSEADDR or not
    assert _bind_as_other_user(server.port) == "Address already in use"
    # a call made while it is down waits and is answered by the server started again in its place
    request = urllib.request.Request(f"{server.url}/flow_runs/count", data=b"{}", method="POST",
                                     headers={"Content-Type": "application/json", **signed_in(server)})
    with urllib.request.urlopen(request, timeout=120) as response:
        assert response.status == 200 and json.loads(response.read()) == 0
    assert running_server(home) == server  # the same recorded process: status, stop and clients unchanged
    second = _served_by(server)
    assert second != first
    said = (server_home(home) / "server.log").read_text()
    assert f"the server (pid {first}) ended by SIGKILL after" in said and "starting it again" in said, said[-2000:]
    # a server stopped on purpose (SIGTERM) ends its keeper and frees the port
    os.kill(second, signal.SIGTERM)
    wait_for(lambda: running_server(home) is None, timeout=30)
    assert _bind_as_other_user(server.port) == "bound"


def test_a_server_whose_home_was_removed_ends_by_itself_and_frees_its_port(home):
    """`rm -r ~/trialflow-experiments` while its server runs, then trialflow again: nothing could find
    the old server any more (`server stop` reads its record in that folder), and it would hold its port
    for good. It ends by itself instead, also when a new folder (and a new server) took the path."""
    old = ensure_server(home, port=0)
    old_app = _served_by(old)
    shutil.rmtree(home)
    new = ensure_server(home, port=0)  # the same path, a new folder: a server of its own
    assert new.pid != old.pid and running_server(home) == new
    wait_for(lambda: not pid_alive(old.pid, old.start_time) and not pid_alive(old_app),
             timeout=FOLDER_CHECK_SECONDS + 20)
    assert _bind_as_other_user(old.port) == "bound"  # its port is free again
    assert new.alive() and new.healthy()  # the new one runs on
    stop_server(home)


def test_a_kernel_that_cannot_name_a_connections_user_stops_the_server_at_once_with_one_line(tmp_path, home):
    """Else every connection, its own user's too, would be refused, and commands would wait minutes."""
    in_sandbox = without_sock_diag(tmp_path / "sandbox")
    for command, extra in ((("server", "start"), {}),  # Prefect's temporary server too: it has no auth string
                           (("create", "--config", str(_config(tmp_path, "sandboxed")), "--foreground"),
                            {"TRIALFLOW_PREFECT_SERVER": "temporary"})):
        started = time.monotonic()
        said = _cli(home, *command, **in_sandbox, **extra)
        assert said.returncode == 1 and time.monotonic() - started < 60, said.stdout + said.stderr
        assert "cannot tell which user makes a connection to it" in said.stdout, said.stdout + said.stderr
        assert "Traceback" not in said.stdout + said.stderr and running_server(home) is None
    ensure_server(home, port=0)  # with the kernel's answer, it serves
    _guard(home)
    stop_server(home)


def test_a_resume_after_a_sigkilled_controller_marks_its_earlier_run_crashed(tmp_path, home):
    """Else the UI shows that run Running for ever beside the resumed one."""
    created, exp_id = _create_sleeper(tmp_path, home, "resumed", 2)
    controller = int(re.search(r"in the background \(pid (\d+)\)", created).group(1))
    store = open_store(tmp_path / "w", exp_id)
    wait_for(lambda: store.trials(["RUNNING"]), timeout=120)
    first_run = store.experiment().flow_run_id
    os.kill(controller, signal.SIGKILL)
    wait_for(lambda: not pid_alive(controller), timeout=10)
    resumed = _cli(home, "resume", exp_id, "--root", str(tmp_path / "w"))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    server = running_server(home)
    earlier = lambda: json.loads(_get(f"{server.url}/flow_runs/{first_run}", server)[1])["state"]  # noqa: E731
    wait_for(lambda: earlier()["type"] == "CRASHED", timeout=60)
    assert store.experiment().flow_run_id in earlier()["message"]
    assert _cli(home, "stop", exp_id).returncode == 0


def test_a_damaged_server_database_is_one_line_at_create_and_status_and_its_advice_works(tmp_path, home):
    ensure_server(home, port=0)
    _guard(home)
    stop_server(home)
    database = server_home(home) / "prefect" / "prefect.db"
    for extra in database.parent.glob("prefect.db-*"):
        extra.unlink()
    database.write_bytes(b"\x13garbage" * 4096)  # the start skips the migration check: last served healthy
    created = _cli(home, "create", "--config", str(_config(tmp_path, "damaged")))
    _guard(home)
    said = f"cannot read its database {database}: it is damaged or its disk is full"
    assert created.returncode == 1 and said in created.stdout and "Traceback" not in created.stdout + created.stderr
    exp_id = created.stdout.split("experiment id: ")[1].split()[0]
    assert open_store(tmp_path / "w", exp_id).experiment().status == "ERROR"
    status = _cli(home, "server", "status")
    assert status.returncode == 1 and said in status.stdout
    assert _cli(home, "server", "stop").returncode == 0  # the advice: stop, move the file away, try again
    database.rename(database.with_name("prefect.db.damaged"))
    again = _cli(home, "create", "--config", str(_config(tmp_path, "fresh")), "--foreground")
    _guard(home)
    assert again.returncode == 0, again.stdout + again.stderr


def test_a_controller_pointed_at_the_kept_server_that_died_meanwhile_starts_it_again(tmp_path, home):
    """`create` points its controllers at the kept server; the server dying before they run (killed,
    the machine's OOM killer) must not end them with advice to unset a variable trialflow set."""
    server = ensure_server(home, port=0)
    _guard(home)
    stop_server(home)
    done = _cli(home, "create", "--config", str(_config(tmp_path, "restarted")), "--foreground",
                **server.client_settings())
    _guard(home)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "unset PREFECT_API_URL" not in done.stdout and running_server(home).port == server.port


def _started_like_an_older_trialflow(home: Path) -> int:
    """A kept server as trialflow made it before its API asked for an auth string: no auth, a record of
    pid, start time and port, no auth file. Returns its pid."""
    from trialflow.trial.procs import process_start_time, write_atomic

    folder = server_home(home)
    (folder / "prefect").mkdir(parents=True)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn bound it then
    sock.bind(("127.0.0.1", free_port()))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(folder / "prefect"), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    with open(folder / "server.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "trialflow.server.kept_server_app", "--fd", str(sock.fileno())],
                                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                pass_fds=(sock.fileno(),))
    port = sock.getsockname()[1]
    sock.close()
    stop_with(os.getpid(), proc.pid)
    write_atomic(str(folder / "server.json"), {"pid": proc.pid, "start_time": process_start_time(proc.pid),
                                               "port": port})
    return proc.pid


def _post(url: str, body: dict, headers: dict[str, str] | None = None) -> tuple[int, object]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, None


def test_a_server_an_older_trialflow_left_open_is_replaced_by_a_private_one(home):
    from trialflow.server.kept_server import OpenServerWarning

    old_pid = _started_like_an_older_trialflow(home)
    old = running_server(home)
    assert old is not None and old.auth is None
    wait_for(old.healthy, timeout=120)
    status, flow = _post(f"{old.url}/flows/", {"name": "someones-sweep"})  # anyone may: it is open
    assert status in (200, 201)
    status, run = _post(f"{old.url}/flow_runs/", {"flow_id": flow["id"],  # type: ignore[index]
                                                 "state": {"type": "RUNNING", "name": "Running"}})
    assert status in (200, 201)
    with pytest.warns(OpenServerWarning, match="started by an older trialflow without API auth"):
        kept = ensure_server(home)  # a run still reports to it: kept for it, with a warning
    assert kept.pid == old_pid
    _post(f"{old.url}/flow_runs/{run['id']}/set_state",  # type: ignore[index]
          {"state": {"type": "COMPLETED", "name": "Completed"}, "force": True})
    new = ensure_server(home)
    assert new.pid != old_pid and new.port == old.port and new.auth
    assert not pid_alive(old_pid)
    assert _post(f"{new.url}/flows/filter", {})[0] == 401  # private now
    assert _post(f"{new.url}/flows/filter", {}, signed_in(new))[0] == 200


def test_two_homes_starting_their_servers_at_once_never_both_take_one_port():
    """Each start holds the port it chose from the moment it chose it: a second start (another home,
    another user) looking at the same moment finds it taken and moves on, so no home's clients reach
    another home's server (they were refused with 401 when two starts raced for 4200)."""
    from trialflow.server.kept_server import _bound

    port = free_port()
    first = _bound(port)
    assert first is not None
    try:
        assert _bound(port) is None  # taken, although its server has not started yet
    finally:
        first.close()
    again = _bound(port)
    assert again is not None
    again.close()


def test_server_start_takes_the_port_and_ui_path_asked_for_keeps_them_and_says_so_when_it_cannot(home):
    port, other = free_port(), free_port()
    started = _cli(home, "server", "start", "--port", str(port))
    assert started.returncode == 0 and f"UI http://127.0.0.1:{port} " in started.stdout, started.stdout
    _guard(home)
    moved = _cli(home, "server", "start", "--port", str(other))
    assert moved.returncode == 1 and moved.stdout.strip() == (
        f"error: the local Prefect server already runs on port {port}: `trialflow server stop`, then "
        f"`trialflow server start --port {other}`")
    assert _cli(home, "server", "stop").returncode == 0
    with socket.socket() as taken_by_another_program:
        taken_by_another_program.bind(("127.0.0.1", other))
        taken_by_another_program.listen()
        taken = _cli(home, "server", "start", "--port", str(other))
    assert taken.returncode == 1 and taken.stdout.strip() == \
        f"error: port {other} on 127.0.0.1 is taken: choose another with --port"
    again = _cli(home, "server", "start")  # later starts keep the port chosen
    assert again.returncode == 0 and f"UI http://127.0.0.1:{port} " in again.stdout, again.stdout
    _guard(home)
    assert _cli(home, "server", "stop").returncode == 0
    hidden_api = _cli(home, "server", "start", "--url-prefix", "/api/ui")
    assert hidden_api.returncode == 1 and hidden_api.stdout.strip() == (
        "error: --url_prefix '/api/ui': /api is where the server's API is; choose another, e.g. --url_prefix nni")
    assert _cli(home, "server", "start", "--url-prefix", "nni").returncode == 0
    _guard(home)
    assert _cli(home, "server", "stop").returncode == 0
    kept = _cli(home, "server", "start")  # later starts keep the path chosen too
    assert kept.returncode == 0 and f"UI http://127.0.0.1:{port}/nni " in kept.stdout, kept.stdout
    _guard(home)
    server = running_server(home)
    settings = json.loads(_get(f"{server.ui_url}/ui-settings", server)[1])
    assert settings["v2_base_url"] == "/nni/v2" and settings["api_url"] == server.url


SAVE_FROM_PYTHON = """
import trialflow
from trialflow.blocks import SSHCredentials
with trialflow.prefect_api():
    SSHCredentials(username="me", password="pw-from-python").save("from-python", overwrite=True)
"""
SAVE_FROM_SHELL = ("from trialflow.blocks import SSHCredentials; "
                   "SSHCredentials(username='me', password='pw-from-shell').save('from-shell', overwrite=True)")
LOOKUP = """
import ssl, sys
from trialflow.blocks import SSHCredentials
from trialflow.blocks._load import load_block
from trialflow.flows.run_api import experiment_api
read = []  # the CA files the clients made from here on read
load = ssl.SSLContext.load_verify_locations
def recorded(ctx, cafile=None, *args, **kwargs):
    read.append(cafile)
    return load(ctx, cafile, *args, **kwargs)
ssl.SSLContext.load_verify_locations = recorded
with experiment_api():  # where an experiment looks its blocks up
    for name in sys.argv[1:]:
        try:
            print(name, load_block(SSHCredentials, name).username)
        except Exception as exc:
            print(name, "missing:", exc)
print("CA files read:", sorted(set(read)))
"""


def test_a_second_shell_and_a_notebook_save_blocks_where_experiments_find_them(tmp_path, home):
    """The README's steps in a fresh shell: `eval "$(trialflow server env)"`, then Prefect's own CLI and
    Python reach the kept server; `trialflow.prefect_api()` does the same inside Python. A block that is
    not there is named with the API it was looked up in."""
    started = _cli(home, "server", "start")
    assert started.returncode == 0, started.stdout + started.stderr
    _guard(home)
    assert 'eval "$(trialflow server env)"' in started.stdout
    server = running_server(home)
    bin_dir = os.path.dirname(sys.executable)
    shell = f"""
        set -e
        eval "$(trialflow server env)"
        test "$PREFECT_API_URL" = {server.url}
        prefect block register -m trialflow.blocks > /dev/null
        python -c "{SAVE_FROM_SHELL}"
        prefect block ls
        """
    proc = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=240,
                          env=_env(home, PATH=f"{bin_dir}:{os.environ['PATH']}"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "from-shell" in proc.stdout and server.auth not in proc.stdout + proc.stderr
    saved = subprocess.run([sys.executable, "-c", SAVE_FROM_PYTHON], capture_output=True, text=True,
                           env=_env(home), timeout=120)
    assert saved.returncode == 0, saved.stderr
    found = subprocess.run([sys.executable, "-c", LOOKUP, "from-shell", "from-python", "gpu2-login"],
                           capture_output=True, text=True, env=_env(home), timeout=120)
    lines = found.stdout.splitlines()
    assert lines[:2] == ["from-shell me", "from-python me"], found.stdout + found.stderr
    assert lines[2].startswith(f"gpu2-login missing: SSHCredentials block 'gpu2-login' not found in the Prefect "
                               f"API at {server.url}")
    # its clients of the plain-HTTP kept server each read the one-root CA file, not the whole bundle
    assert lines[3] == f"CA files read: {[str(PLAIN_HTTP_TRUST)]}", found.stdout
    elsewhere = _cli(home, "server", "env", PREFECT_API_URL="http://127.0.0.1:9/api")
    assert elsewhere.returncode == 1 and "PREFECT_API_URL is set to http://127.0.0.1:9/api" in elsewhere.stdout


HELD = "import os, time, nni\nnni.get_next_parameter()\nwhile os.path.exists({hold!r}):\n    time.sleep(0.1)\n" \
       "nni.report_final_result(1)\n"


PREFIXED_PAGE = re.compile(r"Prefect UI: (http://127\.0\.0\.1:(\d+)/team/nni/v2/runs/flow-run/[0-9a-f-]{36})")


def test_nnictls_port_url_prefix_debug_experiment_dir_and_stop_port_flags(tmp_path, home):
    """nnictl create/resume --port and --url_prefix (its web UI's port and path: the local Prefect
    server's here, when it starts; a second experiment's own port, its address, while it runs on
    another), --debug, resume/view -e/--experiment_dir and stop --port, as NNI spells them."""
    port, other = free_port(), free_port()
    hold = tmp_path / "hold"
    hold.touch()
    config = _config(tmp_path, "flags", HELD.format(hold=str(hold)), maxTrialNumber=1)
    created = _cli(home, "create", "--config", str(config), "--port", str(port), "--debug",
                   "--url_prefix", "/team/nni/")
    assert created.returncode == 0, created.stdout + created.stderr
    _guard(home)
    server = running_server(home)
    assert server.port == port and server.ui_url == f"http://127.0.0.1:{port}/team/nni"
    page, page_port = PREFIXED_PAGE.search(created.stdout).groups()
    assert int(page_port) == port  # the page create printed is on the port and path asked for
    status, html = _get(page, server)
    assert status == 200 and b'"/team/nni/v2/assets/' in html  # the UI's own files load from there too
    exp_id = created.stdout.split("experiment id: ")[1].split()[0]
    store = open_store(tmp_path / "w", exp_id)
    wait_for(lambda: store.trials(["RUNNING"]), timeout=120)
    assert store.experiment().config["logLevel"] == "debug"
    wait_for(lambda: " DEBUG " in (tmp_path / "w" / exp_id / "log" / "experiment.log").read_text(), timeout=60)

    # nnictl's habit: a second experiment on a port of its own, while the server runs on `port`
    second = _cli(home, "create", "--config", str(config), "-p", str(other))
    assert second.returncode == 0, second.stdout + second.stderr
    assert (f"the local Prefect server runs on port {port}: its UI shows this experiment there, and `trialflow "
            f"stop --port {other}` finds it on port {other}") in " ".join(second.stdout.split())
    second_id = second.stdout.split("experiment id: ")[1].split()[0]
    assert f"http://127.0.0.1:{port}/team/nni/v2/runs/flow-run/" in second.stdout  # its page, where the UI is
    elsewhere_in_ui = _cli(home, "create", "--config", str(config), "-u", "other")
    assert elsewhere_in_ui.returncode == 1 and elsewhere_in_ui.stdout.strip() == (
        f"error: the local Prefect server already serves its UI at http://127.0.0.1:{port}/team/nni: `trialflow "
        "server stop`, then `trialflow server start --url_prefix /other`")
    unused = free_port()
    assert _cli(home, "stop", "--port", str(unused)).stdout.strip() == (
        f"error: no experiment is on port {unused} (ports in use: {', '.join(map(str, sorted({port, other})))}): "
        "`trialflow experiment list` shows the running ones")
    # and that listing shows each running experiment's port and platform, as nnictl's does
    rows = {exp: [row["Status"], row["Port"], row["Platform"]]
            for exp, row in nnictl_list_rows(_cli(home, "experiment", "list").stdout).items()}
    assert rows[exp_id] == ["RUNNING", str(port), "local"] and rows[second_id] == [
        "RUNNING", str(other), "local"], rows
    stopped_second = _cli(home, "stop", "-p", str(other))
    assert stopped_second.stdout.strip().endswith(f"experiment {second_id} stopped"), stopped_second.stdout
    assert store.experiment().status == "RUNNING"  # the first goes on
    stopped = _cli(home, "stop", "-p", str(port))
    assert stopped.returncode == 0 and stopped.stdout.strip().endswith(f"experiment {exp_id} stopped"), stopped.stdout
    assert store.experiment().status == "STOPPED"

    elsewhere = tmp_path / "moved"
    elsewhere.mkdir()
    (tmp_path / "w" / exp_id).rename(elsewhere / exp_id)  # a folder the registry does not know
    folder = str(elsewhere / exp_id)
    assert exp_id in _cli(home, "view", exp_id, "-e", folder).stdout
    wrong = _cli(home, "view", exp_id, "-e", str(elsewhere))
    assert wrong.returncode == 1 and f"is not the folder of experiment {exp_id}" in wrong.stdout
    hold.unlink()
    resumed = _cli(home, "resume", exp_id, "-e", folder, "-p", str(port), "-d", "--url_prefix", "team/nni")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    moved = open_store(elsewhere, exp_id)
    wait_for(lambda: moved.experiment().status == "DONE", timeout=120)
    assert moved.experiment().config["logLevel"] == "debug"


def test_a_new_users_first_foreground_run_in_a_terminal_shows_no_prefect_telemetry_notice(tmp_path, home):
    """The kept server runs with analytics off; a new user's first ``create --foreground`` in a terminal
    (Prefect's first import there) shows trialflow's lines, not Prefect's notice asking to turn off what is
    off."""
    from prefect._internal.analytics.ci_detection import CI_ENV_VARS

    from tests.test_stopping import Terminal

    newcomer = tmp_path / "newcomer"
    env = {k: v for k, v in _env(home).items() if k not in CI_ENV_VARS and k != "DO_NOT_TRACK"}
    env.update(HOME=str(newcomer), PREFECT_HOME=str(newcomer / ".prefect"), TERM="xterm")
    term = Terminal([*MODULE, "create", "--config", str(_config(tmp_path, "first")), "--foreground"], env)
    assert term.exit_code(timeout=180) == 0, term.read(0)
    _guard(home)
    out = term.read(0)
    assert "2 trials: 2 SUCCEEDED" in out
    assert "usage data" not in out and "telemetry" not in out, out
