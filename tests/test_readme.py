"""The README's runnable blocks (fenced ```` ```bash runnable ```` or ```` ```python runnable ````), run as
written, the way a new user runs them: from the repository's folder, in a fresh environment with nothing
set but ``PATH``, a new ``HOME`` and an offline pip (no index, the build tools installed here), against
the Prefect server trialflow starts and keeps for that home. A line ending ``# runs until Ctrl-C`` is
started, left to do its work, and then stopped with Ctrl-C (SIGINT), as a user stops it. Each block must
succeed and leave every experiment it made DONE; a documented step that stops working fails here."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import signed_in, wait_for
from trialflow.experiments import list_experiments
from trialflow.server.kept_server import running_server, stop_server
from trialflow.trial.procs import stop_with

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"^```(bash|python) runnable\n(.*?)^```", re.M | re.S)
UNTIL_CTRL_C = "# runs until Ctrl-C"
BLOCKS = BLOCK.findall((ROOT / "README.md").read_text())

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600), pytest.mark.xdist_group("readme")]


def test_the_readme_marks_its_runnable_blocks():
    assert len(BLOCKS) >= 4 and {kind for kind, _ in BLOCKS} == {"bash", "python"}


@pytest.fixture(scope="module")
def fresh_user(tmp_path_factory):
    """A new user's environment (a home of its own); its kept server is stopped at the end, and with
    the test session if that dies."""
    home = tmp_path_factory.mktemp("readme-user")
    env = {"PATH": os.pathsep.join([os.path.dirname(sys.executable), "/usr/local/bin", "/usr/bin", "/bin"]),
           "HOME": str(home), "LANG": "C.UTF-8", "PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "0",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    yield env
    stop_server(home / "trialflow-experiments")


def _guard(env: dict[str, str]) -> None:
    server = running_server(Path(env["HOME"]) / "trialflow-experiments")
    if server is not None:
        stop_with(os.getpid(), server.pid)


def _experiments(env: dict[str, str]) -> dict[str, str]:
    root = Path(env["HOME"]) / "trialflow-experiments"
    return {e.id: e.record.status for e in list_experiments(root)} if root.exists() else {}


def _run(kind: str, text: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = ["bash", "-e", "-o", "pipefail", "-c", text] if kind == "bash" else [sys.executable, "-"]
    return subprocess.run(command, input=None if kind == "bash" else text, cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=400)


@pytest.mark.parametrize(("kind", "text"), BLOCKS, ids=[f"{i}-{kind}" for i, (kind, _) in enumerate(BLOCKS)])
def test_a_runnable_readme_block_runs_as_written(kind, text, fresh_user):
    before = set(_experiments(fresh_user))
    lines = text.splitlines()
    if any(line.rstrip().endswith(UNTIL_CTRL_C) for line in lines):
        assert kind == "bash" and lines[-1].rstrip().endswith(UNTIL_CTRL_C), "it ends its bash block"
        output = _serve_until_its_work_is_done(text, fresh_user, before)
    else:
        done = _run(kind, text, fresh_user)
        output = done.stdout[-3000:] + done.stderr[-3000:]
        assert done.returncode == 0, f"{text}\n---\n{output}"
    _guard(fresh_user)
    made = {e: s for e, s in _experiments(fresh_user).items() if e not in before}
    assert made and set(made.values()) == {"DONE"}, (made, output)


def _serve_until_its_work_is_done(text: str, env: dict[str, str], before: set[str]) -> str:
    """Run the block whose last line serves until Ctrl-C; once the experiments it started are DONE,
    press Ctrl-C (SIGINT to its process group, as a terminal does). Returns its output."""
    log = Path(env["HOME"]) / f"serving-{time.monotonic_ns()}.log"
    with open(log, "wb") as out:
        serving = subprocess.Popen(["bash", "-e", "-o", "pipefail", "-c", text], cwd=ROOT, env=env, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)

    def finished() -> bool:
        """Its experiments are DONE and their flow runs over (their processes gone), as a user sees
        in the UI before pressing Ctrl-C."""
        assert serving.poll() is None, f"it ended before its work was done:\n{log.read_text()[-3000:]}"
        _guard(env)
        made = [e for e in list_experiments(Path(env["HOME"]) / "trialflow-experiments") if e.id not in before]
        return bool(made) and all(e.record.status == "DONE" and _run_is_over(env, e.record.flow_run_id)
                                  for e in made)

    try:
        wait_for(finished, timeout=300, interval=0.5)
    finally:
        for grace in (30, 60):  # Ctrl-C, and again when the first one is not enough (as a user would)
            os.killpg(serving.pid, signal.SIGINT)
            try:
                serving.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        else:
            os.killpg(serving.pid, signal.SIGKILL)
            serving.wait()
            pytest.fail(f"Ctrl-C twice did not stop it:\n{log.read_text()[-3000:]}")
    return log.read_text()[-3000:]


def _run_is_over(env: dict[str, str], flow_run_id: str | None) -> bool:
    """Whether the flow run is in a final state on the kept server of the user's home."""
    server = running_server(Path(env["HOME"]) / "trialflow-experiments")
    if server is None or flow_run_id is None:
        return False
    request = urllib.request.Request(f"{server.url}/flow_runs/{flow_run_id}", headers=signed_in(server))
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)["state_type"] in ("COMPLETED", "FAILED", "CANCELLED", "CRASHED")
