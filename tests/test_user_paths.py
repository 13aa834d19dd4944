"""The ways people drive ``trialflow`` that the designed paths missed: settings refused at create,
install hints, start errors without tracebacks, NNI names trialflow lacks, v1 warnings, --port alone,
create --dashboard. Every command runs as a user runs it: a fresh process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import base_config, wait_for, write_trial
from trialflow.experiments import list_experiments, open_store

QUICK = "import nni\np = nni.get_next_parameter()\nnni.report_final_result(p['x'])\n"
PREFECT_LINE = (" | INFO ", " | WARNING ", " | ERROR ", "Traceback", "Encountered exception")


def cli(*args: str, hide: tuple[str, ...] = (), env: dict | None = None, timeout: float = 180
        ) -> subprocess.CompletedProcess:
    """``trialflow ARGS`` in a fresh process; the modules in ``hide`` cannot be imported there (as on a
    machine without that extra)."""
    code = (f"import sys\nfor m in {list(hide)!r}: sys.modules[m] = None\n"
            "sys.argv = ['trialflow', *sys.argv[1:]]\nfrom trialflow.cli import main\nmain()\n")
    full_env = {**os.environ, "COLUMNS": "200", **(env or {})}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=full_env,
                          timeout=timeout)


def _config(tmp_path: Path, **overrides) -> Path:
    write_trial(tmp_path / "code", QUICK)
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(base_config(tmp_path / "code", tmp_path / "w", **overrides)))
    return path


def _lines(proc: subprocess.CompletedProcess) -> list[str]:
    return (proc.stdout + proc.stderr).strip().splitlines()


def _nothing_created(tmp_path: Path) -> bool:
    return not list_experiments(tmp_path / "w")


@pytest.mark.parametrize("foreground", [False, True])
@pytest.mark.parametrize("overrides,hide,message", [
    ({"tuner": {"name": "TPE", "classArgs": {"optimise_mode": "maximize"}}}, (),
     "error: tuner TPE: unknown classArgs key 'optimise_mode'; allowed: optimize_mode, seed, tpe_args"),
    ({"assessor": {"name": "Medianstop", "classArgs": {"start_step": -1}}}, (),
     "error: assessor Medianstop: classArgs.start_step must be a non-negative integer (got -1)"),
    ({"tuner": {"name": "GP", "classArgs": {"optimize_mode": "maximize"}}}, ("sklearn",),
     "error: the GP tuner needs scikit-learn: pip install 'trialflow[gp]'"),
])
def test_tuner_and_assessor_settings_are_refused_at_create(tmp_path, overrides, hide, message, foreground):
    proc = cli("create", "--config", str(_config(tmp_path, **overrides)), *(["--foreground"] if foreground else []),
               hide=hide)
    assert proc.returncode == 1
    assert _lines(proc) == [message]
    assert _nothing_created(tmp_path)


def test_install_hints_keep_the_extra_in_brackets(tmp_path):
    from trialflow.config import load_config
    from trialflow.experiments import create_experiment

    exp_id, _ = create_experiment(load_config(_config(tmp_path)))
    proc = cli("dashboard", exp_id, "--port", "0", "--root", str(tmp_path / "w"), hide=("optuna_dashboard",))
    assert proc.returncode == 1
    assert _lines(proc) == ["error: optuna_dashboard is not installed; install the plots extra: "
                            "pip install 'trialflow[plots]'"]


@pytest.mark.parametrize("command", ["create", "resume"])
def test_a_start_error_is_one_line_without_a_traceback(tmp_path, command, prefect_server):
    """An unreachable SSH host: the CLI's one line, none of Prefect's logging. create runs on Prefect's
    temporary server, resume on a configured one."""
    service = {"platform": "remote", "machineList": [{"host": "127.0.0.1", "port": 1, "user": "nobody",
                                                      "password": "not-used"}]}
    path = _config(tmp_path, trainingService=service)
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    if command == "resume":
        from trialflow.config import load_config
        from trialflow.experiments import create_experiment

        exp_id, _ = create_experiment(load_config(path), str(path))
        proc = cli("resume", exp_id, "--foreground", "--root", str(tmp_path / "w"),
                   env={"PREFECT_API_URL": prefect_server})
    else:
        proc = subprocess.run([sys.executable, "-m", "trialflow.cli", "create", "--config", str(path), "--foreground"],
                              capture_output=True, text=True, env={**env, "COLUMNS": "200"}, timeout=180)
        exp_id = proc.stdout.split("experiment id: ")[1].split()[0]
    assert proc.returncode == 1
    lines = _lines(proc)
    errors = [line for line in lines if line.startswith("error:")]
    assert errors == [f"error: experiment {exp_id} could not run: nobody@127.0.0.1:1: cannot connect: [Errno None] "
                      "Unable to connect to port 1 on 127.0.0.1 -- check host, port and that sshd runs there"]
    assert lines[-1] == errors[0]
    assert not [line for line in lines if any(mark in line for mark in PREFECT_LINE)], "\n".join(lines)
    assert open_store(tmp_path / "w", exp_id).experiment().status == "ERROR"


@pytest.mark.parametrize("name", ["PPOTuner", "NetworkMorphism", "RegularizedEvolutionTuner"])
def test_nnis_nas_tuners_are_named_out_of_scope(tmp_path, name):
    proc = cli("create", "--config", str(_config(tmp_path, tuner={"name": name})))
    assert proc.returncode == 1
    out = proc.stdout + proc.stderr
    assert f"tuner.name: '{name}' is one of NNI's neural architecture search tuners; NAS is out of" in out
    assert "did you mean" not in out


def test_v1_warnings_print_once_and_only_for_fields_that_asked_for_something(tmp_path, prefect_server):
    write_trial(tmp_path / "code", QUICK)
    (tmp_path / "space.json").write_text('{"x": {"_type": "choice", "_value": [1]}}')
    v1 = {"authorName": "me", "experimentName": "v1", "trialConcurrency": 1, "maxTrialNum": 1,
          "trainingServicePlatform": "local", "searchSpacePath": "space.json", "useAnnotation": False,
          "multiPhase": False, "multiThread": True, "logDir": str(tmp_path / "w"),
          "advisor": {"builtinAdvisorName": "Hyperband", "classArgs": {"optimize_mode": "maximize", "R": 1}},
          "trial": {"command": "python3 trial.py", "codeDir": "code", "gpuNum": 0}}  # NNI's Hyperband example
    path = tmp_path / "v1.yml"
    path.write_text(yaml.safe_dump(v1))
    proc = cli("create", "--config", str(path), "--foreground", env={"PREFECT_API_URL": prefect_server})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    warned = [line for line in _lines(proc) if line.startswith("warning:")]
    assert [w for w in warned if "multiThread" in w] == [
        "warning: multiThread: tuner calls are serialised in the controller; multiThread has no effect (a v1 field)"]
    assert not [w for w in warned if "multiPhase" in w or "gpuNum" in w]
    assert [w for w in warned if "legacy v1" in w] == [  # one line, not Python's warning with a source line
        "warning: converted a legacy v1 (NNI 1.x/2.x) config to the v2 schema; `trialflow config convert` prints "
        "the v2 equivalent"]
    assert [w for w in warned if "advisor" in w] == ['warning: "advisor" is deprecated; it was moved to "tuner"']
    assert "UserWarning" not in proc.stdout + proc.stderr and "site-packages" not in proc.stdout + proc.stderr


@pytest.mark.parametrize("args", [["create", "--config", "{config}", "--dashboard-port", "9000"],
                                  ["resume", "abcdefgh", "--dashboard-port", "9000"],
                                  ["view", "abcdefgh", "--dashboard-port", "0"]])
def test_port_without_dashboard_is_refused(tmp_path, args):
    proc = cli(*[a.format(config=_config(tmp_path)) for a in args])
    assert proc.returncode == 1
    assert _lines(proc) == ["error: --dashboard-port is the dashboard's port: add --dashboard, or leave "
                            "--dashboard-port out"]
    assert _nothing_created(tmp_path)


def test_create_with_a_dashboard_runs_the_experiment(tmp_path, prefect_server):
    path = _config(tmp_path, maxTrialNumber=2)
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "COLUMNS": "200"}
    proc = subprocess.Popen([sys.executable, "-m", "trialflow.cli", "create", "--config", str(path), "--dashboard",
                             "--dashboard-port", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)
    try:
        entry = wait_for(lambda: next(iter(list_experiments(tmp_path / "w")), None), timeout=60)
        wait_for(lambda: open_store(tmp_path / "w", entry.id).experiment().status == "DONE", timeout=120)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        out = proc.communicate(timeout=30)[0]
    assert "dashboard: http://127.0.0.1:" in out and "started in the background" in out
    assert len(open_store(tmp_path / "w", entry.id).trials(["SUCCEEDED"])) == 2


def test_gpus_asked_of_a_machine_without_any_are_refused_at_create_with_the_fix(tmp_path):
    """NNI's PBT example keeps `trialGpuNumber: 1`: on a machine whose PATH has no nvidia-smi, create
    says so in one line naming the setting, instead of starting an experiment that goes ERROR."""
    path = _config(tmp_path, trialGpuNumber=1, trainingService={"platform": "local", "useActiveGpu": False})
    (tmp_path / "bin").mkdir()
    for foreground in ([], ["--foreground"]):
        proc = cli("create", "--config", str(path), *foreground, env={"PATH": str(tmp_path / "bin")})
        assert proc.returncode == 1
        assert _lines(proc) == ["error: trialGpuNumber is 1 but nvidia-smi was not found on PATH: no NVIDIA GPU is "
                                "visible on this machine; set trialGpuNumber to 0 to run the trials without a GPU, "
                                "or run on a machine with GPUs"]
        assert _nothing_created(tmp_path)


@pytest.mark.usefixtures("prefect_server")
def test_a_controller_that_cannot_start_says_why_in_the_experiment_log(tmp_path, monkeypatch):
    """The GPUs were there at create and are gone when the experiment runs: the run ends ERROR and
    experiment.log (the file `create` points to) holds the reason and the fix."""
    from tests.conftest import fake_nvidia_smi
    from trialflow.config import load_config
    from trialflow.experiments import create_experiment
    from trialflow.flows.experiment import experiment_flow

    path = _config(tmp_path, trialGpuNumber=1, trainingService={"platform": "local", "useActiveGpu": False})
    bin_dir = fake_nvidia_smi(tmp_path / "gpus", 1)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    exp_id, exp_dir = create_experiment(load_config(path), str(path))
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable))
    with pytest.raises(Exception, match="set trialGpuNumber to 0"):
        experiment_flow(str(path), exp_id, str(exp_dir.parent))
    assert open_store(exp_dir.parent, exp_id).experiment().status == "ERROR"
    log = (exp_dir / "log" / "experiment.log").read_text()
    assert f"experiment {exp_id} could not start: trialGpuNumber is 1 but nvidia-smi was not found" in log


def test_the_live_table_says_what_it_waits_for_until_the_flow_run_exists(tmp_path):
    """A first foreground run sits at INITIALIZED while the local Prefect server starts: the table says so."""
    from rich.console import Console

    from trialflow import parse_config
    from trialflow.experiments import create_experiment
    from trialflow.presentation.live import STARTING, _LiveView

    write_trial(tmp_path / "code", "import nni\nnni.report_final_result(1)\n")
    exp_id, exp_dir = create_experiment(parse_config(base_config(tmp_path / "code", tmp_path / "w")))
    console = Console(record=True, width=200)
    view = _LiveView(exp_dir.parent, exp_id)

    def shown() -> str:
        console.print(view.table())
        return console.export_text()

    assert "INITIALIZED" in shown() and STARTING in shown()
    store = open_store(exp_dir.parent, exp_id)
    store.set_experiment(flow_run_id="c7646baa-d591-4235-8251-1c19ad8735cb", prefect_api="http://127.0.0.1:4200/api")
    assert STARTING not in shown() and "/runs/flow-run/c7646baa-d591-4235-8251-1c19ad8735cb" in shown()
    view.close()
