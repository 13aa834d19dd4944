"""Start-up: how long until a user's first trial runs.

* ``trialflow --help`` (the CLI's import alone; target <= 0.3 s);
* warm: the kept Prefect server runs; from ``trialflow create`` starting to the first trial's process
  (its first line writes the time), in the background with the spare controller an earlier create
  left ready (target <= 0.27x NNI 3.0's, with ``--nni-venv``), in the background without one (the first
  create of a shell: ``TRIALFLOW_SPARE_CONTROLLER=0``) and with ``--foreground`` (target <= 2.0 s);
* cold: the kept server is stopped (its database exists, as after a reboot) and starts with the
  experiment (target <= 6 s, and below NNI 3.0);
* first use: a new TRIALFLOW_HOME, so the server also creates its database (reported, no target);
* with ``--nni-venv`` (``pip install nni==3.0``; ``--install-nni`` creates it): NNI 3.0's
  ``nnictl create`` to its first trial, on the same trial and machine.

Medians over ``--repeat`` runs (default 3). trialflow is run as its console script beside this Python
and its trial by this Python's path (as NNI's ``nnictl`` and trial run from its venv), not through a PATH
wrapper such as pyenv's shims (~0.2 s each).

    python benchmarks/startup.py [--repeat 3] [--nni-venv DIR [--install-nni]] [--venv DIR]

``--venv DIR`` runs trialflow from a clean virtualenv holding this checkout, as NNI runs from its own
(``benchmarks/_venv.py`` says why it matters).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._stats import print_table, summary_row  # noqa: E402
from benchmarks._venv import add_venv_option, nni_experiment, rerun_in  # noqa: E402
from trialflow.server.api_choice import set_process_defaults  # noqa: E402

TRIAL = ("import time\nopen({stamp!r}, 'a').write(f'{{time.time()}}\\n')\nimport nni\n"
         "nni.get_next_parameter()\nnni.report_final_result(1.0)\n")


def _console_script() -> list[str]:
    script = Path(sys.executable).with_name("trialflow")
    return [str(script)] if script.exists() else ["trialflow"]


TRIALFLOW = _console_script()  # the command that runs trialflow (an A/B may point it elsewhere)


def _write_experiment(folder: Path, stamp: Path) -> Path:
    code = folder / "code"
    code.mkdir(parents=True, exist_ok=True)
    (code / "trial.py").write_text(TRIAL.format(stamp=str(stamp)))
    config = {"searchSpace": {"x": {"_type": "uniform", "_value": [0, 1]}},
              "trialCommand": f"{sys.executable} trial.py", "trialCodeDirectory": str(code),
              "trialConcurrency": 1, "maxTrialNumber": 1,
              "tuner": {"name": "TPE"}, "trainingService": {"platform": "local"},
              "experimentWorkingDirectory": str(folder / "w")}
    path = folder / "config.json"
    path.write_text(json.dumps(config))
    return path


def _first_trial_after(start: float, stamp: Path, timeout: float = 120.0) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return float(stamp.read_text().split()[0]) - start
        except (OSError, IndexError, ValueError):
            time.sleep(0.01)
    raise TimeoutError(f"no trial started within {timeout:.0f} s")


def _env(home: Path, spare: bool = True) -> dict[str, str]:
    # bytecode cached as a user's Python does (a PYTHONDONTWRITEBYTECODE here would compile every
    # changed module at every start)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PREFECT_API_URL", "PYTHONDONTWRITEBYTECODE", "TRIALFLOW_SPARE_CONTROLLER")}
    return {**env, "TRIALFLOW_HOME": str(home), "TRIALFLOW_PREFECT_SERVER": "kept",
            **({} if spare else {"TRIALFLOW_SPARE_CONTROLLER": "0"})}


def _spare_ready(home: Path, timeout: float = 60.0) -> None:
    """Wait until the spare controller the last create started listens (as it does seconds later)."""
    from trialflow.server.kept_server import server_home
    from trialflow.server.spare_record import RECORD
    from trialflow.trial.procs import read_json

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (read_json(str(server_home(home) / RECORD)) or {}).get("socket"):
            return
        time.sleep(0.05)
    raise TimeoutError(f"no spare controller within {timeout:.0f} s")


def trialflow_first_trial(folder: Path, home: Path, foreground: bool, spare: bool = True) -> float:
    """Seconds from ``trialflow create`` starting to its first trial's process writing its stamp."""
    stamp = folder / "stamp"
    stamp.unlink(missing_ok=True)
    config = _write_experiment(folder, stamp)
    args = [*TRIALFLOW, "create", "--config", str(config), *(["--foreground"] if foreground else [])]
    start = time.time()
    proc = subprocess.Popen(args, env=_env(home, spare), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        return _first_trial_after(start, stamp)
    finally:
        proc.wait(timeout=120)


def help_seconds(repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run([*TRIALFLOW, "--help"], check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _wait_done(folder: Path, home: Path) -> None:
    """Let the experiment end, its controller exit and the spare it left finish loading before the next
    run (either would compete for the CPU)."""
    from trialflow.experiments import has_store, open_store
    from trialflow.server.kept_server import running_server
    from trialflow.trial.procs import pid_alive

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        out = subprocess.run([*TRIALFLOW, "experiment", "list", "--root", str(folder / "w")], env=_env(home),
                             capture_output=True, text=True).stdout
        if "RUNNING" not in out and "INITIALIZED" not in out:
            break
        time.sleep(0.2)
    for exp_dir in (folder / "w").iterdir():
        if has_store(exp_dir):
            store = open_store(folder / "w", exp_dir.name)
            pid = store.experiment().controller_pid
            store.close()
            while pid and pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
    if running_server(home) is not None:
        _spare_ready(home)


def measure(repeat: int, nni_venv: Path | None = None) -> dict[str, float]:
    from trialflow.server.kept_server import ensure_server, stop_server

    results: dict[str, list[float]] = {"warm background": [], "warm background, no spare": [],
                                       "warm foreground": [], "cold": [], "first use": []}
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        ensure_server(home)
        try:
            folder = Path(tmp) / "leaves-a-spare"
            trialflow_first_trial(folder, home, False)  # as a shell's earlier create
            _wait_done(folder, home)
            for i in range(repeat):
                for mode in ("background", "background, no spare", "foreground"):
                    folder = Path(tmp) / f"{mode.replace(', ', '-').replace(' ', '-')}-{i}"
                    if mode == "background":
                        _spare_ready(home)
                    results[f"warm {mode}"].append(trialflow_first_trial(
                        folder, home, mode == "foreground", spare=mode != "background, no spare"))
                    _wait_done(folder, home)
            for i in range(repeat):
                stop_server(home)
                folder = Path(tmp) / f"cold-{i}"
                results["cold"].append(trialflow_first_trial(folder, home, False))
                _wait_done(folder, home)
        finally:
            stop_server(home)
        for i in range(repeat):
            fresh = Path(tmp) / f"fresh-home-{i}"
            folder = Path(tmp) / f"first-{i}"
            try:
                results["first use"].append(trialflow_first_trial(folder, fresh, False))
                _wait_done(folder, fresh)
            finally:
                stop_server(fresh)
                shutil.rmtree(fresh, ignore_errors=True)
        figures = {name: statistics.median(values) for name, values in results.items()}
        figures["help"] = help_seconds(max(5, repeat))
        if nni_venv is not None:
            figures["nni"] = statistics.median(nni_first_trial(nni_venv, Path(tmp) / f"nni-{i}") for i in range(repeat))
    return figures


def nni_first_trial(venv: Path, folder: Path) -> float:
    """Seconds from ``nnictl create`` starting to NNI 3.0's first trial writing its stamp."""
    stamp = folder / "stamp"
    code = folder / "code"
    code.mkdir(parents=True)
    (code / "trial.py").write_text(TRIAL.format(stamp=str(stamp)))
    config = {"searchSpace": {"x": {"_type": "uniform", "_value": [0, 1]}},
              "trialCommand": f"{venv / 'bin' / 'python'} trial.py", "trialCodeDirectory": str(code),
              "trialConcurrency": 1, "maxTrialNumber": 1, "tuner": {"name": "TPE"},
              "trainingService": {"platform": "local"}, "experimentWorkingDirectory": str(folder / "nni")}
    path = folder / "config.json"
    path.write_text(json.dumps(config))
    start = time.time()
    with nni_experiment(venv, path, folder / "home", timeout=120):
        return _first_trial_after(start, stamp)


def summary(profile: str, nni_venv: Path | None = None) -> list[list[object]]:
    """Rows for ``python -m benchmarks``."""
    f = measure(3 if profile == "short" else 5, nni_venv)
    name = "start-up"
    rows = [summary_row(name, "trialflow --help", f["help"], "s", "0.3 s budget", 0.3, 1.0),
            summary_row(name, "create -> first trial, warm server (background, spare ready)", f["warm background"],
                        "s", "2 s budget", 2.0, 1.0),
            summary_row(name, "create -> first trial, warm server (background, no spare)",
                        f["warm background, no spare"], "s", "2 s budget", 2.0, 1.0),
            summary_row(name, "create -> first trial, warm server (--foreground)", f["warm foreground"], "s",
                        "2 s budget", 2.0, 1.0),
            summary_row(name, "create -> first trial, cold server", f["cold"], "s", "6 s budget", 6.0, 1.0),
            summary_row(name, "create -> first trial, first use (new database)", f["first use"], "s", "-", None)]
    if "nni" in f:
        rows.append(summary_row(name, "create -> first trial, cold server", f["cold"], "s",
                                "NNI 3.0 nnictl create", f["nni"], 0.8))
        rows.append(summary_row(name, "create -> first trial, warm server (spare ready)", f["warm background"], "s",
                                "NNI 3.0 nnictl create", f["nni"], 0.27))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--nni-venv", type=Path)
    parser.add_argument("--install-nni", action="store_true")
    add_venv_option(parser)
    args = parser.parse_args()
    rerun_in(args.venv)
    set_process_defaults()  # as a trialflow command runs
    if args.install_nni and args.nni_venv:
        from benchmarks.overhead import install_nni

        install_nni(args.nni_venv)
    f = measure(args.repeat, args.nni_venv)
    print_table(f"start-up, medians of {args.repeat} runs", ["measure", "seconds", "target"],
                [["trialflow --help", f"{f['help']:.2f}", "<= 0.3"],
                 ["create -> first trial, warm server, background, spare ready", f"{f['warm background']:.2f}",
                  "<= 0.27x NNI" if "nni" in f else "<= 2.0"],
                 ["create -> first trial, warm server, background, no spare",
                  f"{f['warm background, no spare']:.2f}", "<= 2.0"],
                 ["create -> first trial, warm server, --foreground", f"{f['warm foreground']:.2f}", "<= 2.0"],
                 ["create -> first trial, cold server (database exists)", f"{f['cold']:.2f}", "<= 6.0"],
                 ["create -> first trial, first use (new database)", f"{f['first use']:.2f}", "-"],
                 *([["NNI 3.0: nnictl create -> first trial", f"{f['nni']:.2f}", "cold below it"],
                    ["ratio warm (spare ready) / NNI 3.0", f"{f['warm background'] / f['nni']:.2f}", "<= 0.27"],
                    ["ratio cold / NNI 3.0", f"{f['cold'] / f['nni']:.2f}", "<= 0.8"]]
                   if "nni" in f else [])])


if __name__ == "__main__":
    main()
