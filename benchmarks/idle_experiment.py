"""A running experiment whose trials do nothing: what its controller and its server spend meanwhile.

Trials train for minutes or hours, mostly on GPUs or other machines, while the controller that follows
them sits on a login node beside other people's work; what it spends between their results is paid for
as long as they run. ``--trials`` local trials that sleep (default 16, all running at once) under
trialflow's background ``create`` and, with ``--nni-venv DIR`` (``pip install nni==3.0``;
``--install-nni`` creates it), under NNI 3.0's ``nnictl create``; after ``--settle`` s, the CPU-seconds
per minute over ``--windows`` windows of ``--window`` s (medians):

* trialflow: the controller's process tree (its forkserver, the trials' keepers and the sleeping trials
  included) and the kept Prefect server's session, apart and together;
* NNI 3.0: the NNI manager's process tree (its dispatcher, the trials' processes included).

Target: trialflow's controller at most NNI 3.0's manager (the kept server is shared by every experiment
of its home and outlives them; ``idle_server.py`` holds it to Prefect's own server). Each side runs
alone, in a throwaway home.

    python benchmarks/idle_experiment.py [--trials 16] [--nni-venv DIR [--install-nni]]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._stats import print_table, summary_row  # noqa: E402
from benchmarks._venv import nni_experiment  # noqa: E402
from benchmarks.idle_server import cpu_per_minute  # noqa: E402
from benchmarks.overhead import install_nni  # noqa: E402
from benchmarks.scale import _running, _session_cpu_seconds, _tree_cpu_seconds  # noqa: E402

TRIAL = "import time, nni\nnni.get_next_parameter()\ntime.sleep(3600)\nnni.report_final_result(1.0)\n"


def _config(code: Path, trials: int, python: str) -> dict[str, object]:
    (code / "trial.py").write_text(TRIAL)
    return {"searchSpace": {"x": {"_type": "uniform", "_value": [0, 1]}}, "trialCommand": f"{python} trial.py",
            "trialCodeDirectory": str(code), "trialConcurrency": trials, "maxTrialNumber": trials,
            "tuner": {"name": "Random"}, "trainingService": {"platform": "local"}}


def trialflow_idle(folder: Path, trials: int, settle: float, windows: int, window: float) -> dict[str, float]:
    """CPU-seconds per minute of a background experiment's controller and kept server while its
    ``trials`` trials sleep."""
    from trialflow.server.kept_server import ensure_server, stop_server

    home, code = folder / "home", folder / "code"
    code.mkdir(parents=True)
    path = folder / "config.json"
    path.write_text(json.dumps({**_config(code, trials, sys.executable),
                                "experimentWorkingDirectory": str(folder / "w")}))
    env = {**os.environ, "HOME": str(home), "TRIALFLOW_HOME": str(home / "experiments"),
           "TRIALFLOW_SPARE_CONTROLLER": "0"}
    created = subprocess.run([sys.executable, "-m", "trialflow.cli", "create", "--config", str(path)], env=env,
                             capture_output=True, text=True, timeout=300, check=True)
    controller = int(created.stdout.split("in the background (pid ")[1].split(")")[0])
    exp_id = created.stdout.split("experiment id: ")[1].split()[0]
    server = ensure_server(home / "experiments").pid
    def cpu() -> dict[str, float]:
        return {"controller": _tree_cpu_seconds(controller), "server": _session_cpu_seconds(server)}

    try:
        return cpu_per_minute(cpu, settle, windows, window)
    finally:
        subprocess.run([sys.executable, "-m", "trialflow.cli", "stop", exp_id], env=env, capture_output=True,
                       timeout=300)
        deadline = time.monotonic() + 120  # its last calls need the server: it stops once the controller has
        while Path(f"/proc/{controller}").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        stop_server(home / "experiments")


def nni_idle(venv: Path, folder: Path, trials: int, settle: float, windows: int, window: float) -> float:
    """CPU-seconds per minute of NNI 3.0's manager (its tree) while its ``trials`` trials sleep."""
    code = folder / "code"
    code.mkdir(parents=True)
    path = folder / "config.json"
    path.write_text(json.dumps({**_config(code, trials, str(venv / "bin" / "python")),
                                "experimentWorkingDirectory": str(folder / "nni")}))
    with nni_experiment(venv, path, folder / "home") as port:
        managers = [pid for pid in _running(b"nni_node")
                    if str(port).encode() in Path(f"/proc/{pid}/cmdline").read_bytes()]
        if not managers:
            raise RuntimeError("NNI's manager process was not found")
        return cpu_per_minute(lambda: {"nni": _tree_cpu_seconds(managers[0])}, settle, windows, window)["nni"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--settle", type=float, default=30.0, help="seconds after the create, first")
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--window", type=float, default=30.0, help="seconds per window")
    parser.add_argument("--nni-venv", type=Path)
    parser.add_argument("--install-nni", action="store_true", help="create --nni-venv with nni==3.0 first")
    args = parser.parse_args()
    if args.install_nni and args.nni_venv is not None and not args.nni_venv.exists():
        install_nni(args.nni_venv)
    with tempfile.TemporaryDirectory() as tmp:
        ours = trialflow_idle(Path(tmp) / "trialflow", args.trials, args.settle, args.windows, args.window)
        nni = (nni_idle(args.nni_venv, Path(tmp) / "nni", args.trials, args.settle, args.windows, args.window)
               if args.nni_venv is not None else None)
    total = ours["controller"] + ours["server"]
    title = (f"{args.trials} sleeping trials, CPU-seconds per minute "
             f"(median of {args.windows} windows of {args.window:g} s)")
    rows: list[list[object]] = [["trialflow: controller (its tree, trials included)", f"{ours['controller']:.2f}"],
            ["trialflow: kept Prefect server", f"{ours['server']:.2f}"],
            ["trialflow: together", f"{total:.2f}"]]
    if nni is not None:
        rows.append(["NNI 3.0: manager (its tree, trials included)", f"{nni:.2f}"])
    print_table(title, ["measure", "CPU-s/min"], rows)
    if nni is not None:
        print_table("summary", ["bench", "measure", "value", "baseline", "base value", "ratio", "target", "verdict"],
                    [summary_row("idle_experiment", f"{args.trials} sleeping trials: controller", ours["controller"],
                                 "CPU-s/min", "NNI 3.0's manager", nni, target=1.0),
                     summary_row("idle_experiment", f"{args.trials} sleeping trials: controller and server", total,
                                 "CPU-s/min", "NNI 3.0's manager", nni)])


if __name__ == "__main__":
    main()
