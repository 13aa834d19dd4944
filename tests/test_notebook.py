"""``trialflow.run_experiment()`` called from a Jupyter notebook: cells run by nbclient in a real
IPython kernel, whose event loop is running while the cell runs (Prefect then hands back coroutines
where a script gets values). Result and status, errors raised in the cell, an interrupted cell, a
second call in the same kernel."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import textwrap
import threading
from pathlib import Path

import nbclient
import nbformat
import pytest

from tests.conftest import PYTHON, base_config, only_experiment, wait_for, write_trial
from trialflow.experiments import open_store

TRIAL = """
import os, sys, time, nni
p = nni.get_next_parameter()
hold = os.environ.get("HOLD_FILE")
while hold and not os.path.exists(hold):
    time.sleep(0.05)
nni.report_final_result(p["x"])
"""

RAISING_TUNER = """
from nni.tuner import Tuner


class BrokenTuner(Tuner):
    def update_search_space(self, search_space):
        pass

    def generate_parameters(self, parameter_id, **kwargs):
        raise ValueError("the tuner's own bug")

    def receive_trial_result(self, parameter_id, parameters, value, **kwargs):
        pass
"""


class Notebook:
    """One kernel, cells run in it one at a time as a notebook runs them. nbclient's sockets live on
    one event loop, in a thread of its own, so a test can interrupt the kernel while a cell runs."""

    def __init__(self, client, loop: asyncio.AbstractEventLoop) -> None:
        self.client = client
        self.loop = loop

    def start(self, source: str) -> concurrent.futures.Future:
        """Start ``source`` as the next cell; the future gives what :meth:`run` returns."""
        cell = nbformat.v4.new_code_cell(textwrap.dedent(source))
        self.client.nb.cells.append(cell)
        index = len(self.client.nb.cells) - 1

        async def execute() -> dict:
            try:
                await self.client.async_execute_cell(cell, index)
            except nbclient.exceptions.CellExecutionError:
                pass  # the error is in the cell's outputs, as a notebook shows it
            return _outputs(cell)

        return asyncio.run_coroutine_threadsafe(execute(), self.loop)

    def run(self, source: str, timeout: float = 240) -> dict:
        """Run ``source`` as the next cell; returns its outputs: ``stdout`` and ``stderr`` (text) and
        ``error`` (``ename: evalue``, or None)."""
        return self.start(source).result(timeout)

    def interrupt(self) -> None:
        """What the notebook's stop button does: interrupt the kernel (SIGINT)."""
        asyncio.run_coroutine_threadsafe(self.client.km.interrupt_kernel(), self.loop).result(30)


def _outputs(cell) -> dict:
    stdout, stderr, error = [], [], None
    for output in cell.outputs:
        if output.output_type == "stream":
            (stdout if output.name == "stdout" else stderr).append(output.text)
        elif output.output_type == "error":
            error = f"{output.ename}: {output.evalue}"
    return {"stdout": "".join(stdout), "stderr": "".join(stderr), "error": error}


@pytest.fixture
def jupyter_kernel(prefect_server, isolated_home):
    """A fresh IPython kernel (the session's Prefect server and the test's homes in its environment),
    shut down after the test."""
    (isolated_home / "home").mkdir(exist_ok=True)  # IPython's profile goes there
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    client = nbclient.NotebookClient(nbformat.v4.new_notebook(), kernel_name="python3", timeout=240,
                                     allow_errors=True)
    kernel = client.async_setup_kernel()
    asyncio.run_coroutine_threadsafe(kernel.__aenter__(), loop).result(120)
    try:
        yield Notebook(client, loop)
    finally:
        asyncio.run_coroutine_threadsafe(kernel.__aexit__(None, None, None), loop).result(120)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)


def _config(tmp_path: Path, **overrides) -> dict:
    code = tmp_path / "code"
    write_trial(code, TRIAL)
    return base_config(code, tmp_path / "w", trialCommand=f"{PYTHON} trial.py", **overrides)


def test_a_notebook_call_returns_the_status_and_a_second_call_in_the_kernel_runs_too(jupyter_kernel, tmp_path):
    config = _config(tmp_path, maxTrialNumber=3)
    first = jupyter_kernel.run(f"""
        import trialflow
        result = trialflow.run_experiment({config!r})
        print("status", repr(result.status), len(result.trials), result.best.status)
        """)
    assert first["error"] is None, first
    assert "status 'DONE' 3 SUCCEEDED" in first["stdout"], first
    assert "never awaited" not in first["stderr"], first["stderr"]
    second = jupyter_kernel.run(f"""
        again = trialflow.run_experiment({config!r})
        print("again", repr(again.status), len(again.trials), again.experiment_id != result.experiment_id)
        """)
    assert second["error"] is None, second
    assert "again 'DONE' 3 True" in second["stdout"], second


def test_a_tuner_that_raises_raises_in_the_cell(jupyter_kernel, tmp_path):
    algorithms = tmp_path / "algorithms"
    algorithms.mkdir()
    (algorithms / "broken_tuner.py").write_text(RAISING_TUNER)
    config = _config(tmp_path, tuner={"className": "broken_tuner.BrokenTuner", "codeDirectory": str(algorithms)})
    cell = jupyter_kernel.run(f"""
        import trialflow
        trialflow.run_experiment({config!r})
        print("returned normally")
        """)
    assert cell["error"] is not None and cell["error"].startswith("TunerError"), cell
    assert "the tuner's own bug" in cell["error"]
    assert "returned normally" not in cell["stdout"]
    after = jupyter_kernel.run("print('the kernel goes on')")
    assert after["stdout"].strip() == "the kernel goes on"


def test_an_interrupted_cell_stops_its_experiment_and_the_kernel_runs_the_next(jupyter_kernel, tmp_path):
    """Interrupting the kernel (the notebook's stop button: SIGINT) while trials run: the cell ends in
    KeyboardInterrupt, the experiment is recorded STOPPED with its trials stopped, none left running."""
    hold = tmp_path / "release"
    config = _config(tmp_path, maxTrialNumber=4, trialConcurrency=2)
    cell = jupyter_kernel.start(f"""
        import os, trialflow
        os.environ["HOLD_FILE"] = {str(hold)!r}
        trialflow.run_experiment({config!r})
        """)
    root = tmp_path / "w"

    def running_trials():
        found = only_experiment(root)
        return found[0] if found and sum(t.status == "RUNNING" for t in found[1]) == 2 else None

    experiment_id = wait_for(running_trials, timeout=120)
    jupyter_kernel.interrupt()
    outcome = cell.result(timeout=120)
    assert outcome["error"] is not None and outcome["error"].startswith("KeyboardInterrupt"), outcome
    store = open_store(root, experiment_id)
    try:
        record, trials = store.experiment(), store.trials()
    finally:
        store.close()
    assert record.status == "STOPPED", (record.status, record.message)
    assert {t.status for t in trials} == {"USER_CANCELED"}, [(t.id, t.status) for t in trials]
    hold.touch()
    after = jupyter_kernel.run(f"""
        again = trialflow.run_experiment({dict(config, maxTrialNumber=2)!r})
        print("after", again.status, len(again.trials))
        """)
    assert after["error"] is None and "after DONE 2" in after["stdout"], after


def test_a_block_saved_in_a_notebook_as_the_readme_says_is_where_experiments_look(jupyter_kernel):
    """A notebook's event loop runs while its cell does, so Prefect's ``save`` there hands back a
    coroutine, which saves nothing unless awaited: the README says to await it."""
    from trialflow.blocks import SSHCredentials
    from trialflow.blocks._load import load_block
    from trialflow.flows.run_api import experiment_api

    saved = jupyter_kernel.run("""
        import trialflow
        from trialflow.blocks import SSHCredentials
        with trialflow.prefect_api():
            await SSHCredentials(username="from-a-notebook", password="pw").save("nb-login", overwrite=True)
        """)
    assert saved["error"] is None and "never awaited" not in saved["stderr"], saved
    with experiment_api():  # where an experiment of this environment looks its blocks up
        assert load_block(SSHCredentials, "nb-login").username == "from-a-notebook"


def test_jupyter_kernel_sees_the_tests_homes(jupyter_kernel, tmp_path):
    """The kernel reads and writes only the test's homes (the audit walks them), never the user's."""
    cell = jupyter_kernel.run("import json, os; print(json.dumps({k: os.environ.get(k) for k in "
                              "('HOME', 'TRIALFLOW_HOME', 'PREFECT_API_URL')}))")
    seen = json.loads(cell["stdout"])
    assert seen["HOME"] == str(tmp_path / "home") and seen["TRIALFLOW_HOME"] == str(tmp_path / "experiments")
    assert seen["PREFECT_API_URL"]
