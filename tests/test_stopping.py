"""How people stop a running experiment: Ctrl-C in the terminal that runs it (a real pseudo-terminal,
so the signal reaches the whole foreground process group as a terminal sends it), and Prefect's
cancel and retry of its flow run."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import base_config, wait_for, write_trial
from trialflow.experiments import list_experiments, open_store
from trialflow.records.store import ExperimentStore

pytestmark = pytest.mark.e2e  # each runs an experiment and stops it

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # rich's colours and cursor moves
HOLD = "import os, time, nni\np = nni.get_next_parameter()\nwhile os.path.exists({hold!r}):\n    time.sleep(0.2)\n" \
       "nni.report_final_result(p['x'])\n"


class Terminal:
    """A command run in a pseudo-terminal of its own, as a shell runs a foreground job."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: its session's controlling terminal is the pty
            os.execvpe(args[0], args, env)
        self.output = b""

    def read(self, seconds: float = 0.2) -> str:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if not select.select([self.fd], [], [], left)[0]:
                break
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            self.output += chunk
        return ANSI.sub("", self.output.decode(errors="replace"))

    def wait_for_text(self, pattern: str, timeout: float) -> re.Match[str]:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if found := re.search(pattern, self.read()):
                return found
        raise AssertionError(f"{pattern!r} not printed in {timeout} s:\n{self.read(0)}")

    def wait_until(self, predicate, what: str, timeout: float) -> None:
        """Reads the terminal while waiting, as a terminal does: a full one would block the command."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self.read(0.1)
            if predicate():
                return
        raise AssertionError(f"{what}: not reached in {timeout} s:\n{self.read(0)}")

    def ctrl_c(self) -> None:
        os.write(self.fd, b"\x03")  # the line discipline turns it into SIGINT for the foreground group

    def exit_code(self, timeout: float) -> int:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self.read(0.1)
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
        os.kill(self.pid, signal.SIGKILL)
        raise AssertionError(f"still running {timeout} s later:\n{self.read(0)}")


def _setup(tmp_path: Path, temporary: bool = True, **overrides) -> tuple[Path, Path, dict[str, str]]:
    """A config of held trials, its hold file, and the environment of the command that runs it: on
    Prefect's temporary server (``temporary``) or on the session's (``prefect_server``)."""
    code = tmp_path / "code"
    hold = tmp_path / "hold"
    hold.touch()
    write_trial(code, HOLD.format(hold=str(hold)))
    config = tmp_path / "config.yml"
    config.write_text(yaml.safe_dump(base_config(code, tmp_path / "w", trialConcurrency=2, maxTrialNumber=3,
                                                 **overrides)))
    env = {k: v for k, v in os.environ.items() if not (temporary and k == "PREFECT_API_URL")}
    env.update(COLUMNS="160", TERM="xterm")
    return config, hold, env


def _trialflow(*args: str) -> list[str]:
    return [sys.executable, "-m", "trialflow.cli", *args]


def _servers_of(pid: int) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and b"create_app" in (proc / "cmdline").read_bytes() \
                    and (proc / "stat").read_text().rsplit(")", 1)[1].split()[1] == str(pid):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def _two_trials_running(tmp_path: Path, temporary: bool = True) -> tuple[Terminal, str, ExperimentStore, Path,
                                                                         dict[str, str]]:
    """``trialflow create --foreground`` in a terminal, once two held trials run (on Prefect's temporary
    server or the session's: :func:`_setup`)."""
    config, hold, env = _setup(tmp_path, temporary)
    term = Terminal(_trialflow("create", "--config", str(config), "--foreground"), env)
    exp_id = term.wait_for_text(r"experiment id: (\w+)", 60)[1]
    store = open_store(tmp_path / "w", exp_id)
    term.wait_until(lambda: len(store.trials(["RUNNING"])) == 2, "two trials running", timeout=240)
    return term, exp_id, store, hold, env


def test_ctrl_c_stops_a_foreground_experiment_within_seconds(tmp_path):
    term, exp_id, store, _, _ = _two_trials_running(tmp_path)
    servers = _servers_of(term.pid)
    assert len(servers) == 1  # Prefect's temporary server, in a session of its own
    pressed = time.monotonic()
    term.ctrl_c()
    assert term.exit_code(timeout=15) == 130
    took = time.monotonic() - pressed
    assert took < 8, f"Ctrl-C took {took:.1f} s"
    out = term.read(0)
    assert f"experiment {exp_id} stopped by Ctrl-C: its running trials were cancelled; resume it: " \
           f"trialflow resume {exp_id}" in out
    assert "Traceback" not in out and "Connect call failed" not in out
    assert store.experiment().status == "STOPPED"
    assert [t.status for t in store.trials()] == ["USER_CANCELED", "USER_CANCELED"]
    wait_for(lambda: not Path(f"/proc/{servers[0]}").exists(), timeout=15)  # the server ended with it


def test_a_second_ctrl_c_quits_at_once_and_resume_finishes_the_experiment(tmp_path, prefect_server):
    term, exp_id, store, hold, env = _two_trials_running(tmp_path, temporary=False)
    term.ctrl_c()
    time.sleep(0.05)
    term.ctrl_c()
    pressed = time.monotonic()
    assert term.exit_code(timeout=10) == 130
    assert time.monotonic() - pressed < 3
    assert f"trialflow resume {exp_id}" in term.read(0)

    hold.unlink()  # from here on, trials finish
    again = Terminal(_trialflow("resume", exp_id, "--foreground"), env)
    assert again.exit_code(timeout=120) == 0, again.read(0)
    record = store.experiment()
    assert record.status == "DONE" and store.count_trials() == 3
    assert [e.record.status for e in list_experiments(tmp_path / "w")] == ["DONE"]


def test_sigterm_stops_a_foreground_experiment_like_ctrl_c(tmp_path, prefect_server):
    """`kill PID` (systemd, a job scheduler) asks for the same clean stop, exit code 143."""
    term, exp_id, store, _, _ = _two_trials_running(tmp_path, temporary=False)
    os.kill(term.pid, signal.SIGTERM)
    assert term.exit_code(timeout=15) == 143
    assert f"experiment {exp_id} stopped by SIGTERM: its running trials were cancelled" in term.read(0)
    assert "Traceback" not in term.read(0)
    record = store.experiment()
    assert record.status == "STOPPED" and record.message == "stopped by SIGTERM"
    assert [t.status for t in store.trials()] == ["USER_CANCELED", "USER_CANCELED"]
