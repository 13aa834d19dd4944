"""Experiment overhead on the local service: N trivial Python trials (sleep 0.5 s) at concurrency C.

Prints wall time / ideal (ceil(N/C) x 0.5 s) for trialflow (full experiment flow: tuner, store,
Prefect task runs, trial keeper) beside a bare ``subprocess`` pool running the same commands in the
same run, and the ratio between the two (target: trialflow within 1.25x of the bare pool). With
``--nni-venv`` (a virtualenv holding ``pip install nni==3.0``; ``--install-nni`` creates it) the same
experiment also runs on NNI 3.0 through ``nnictl create`` and its REST API, on 127.0.0.1.

    python benchmarks/overhead.py [--trials 200] [--concurrency 8] [--nni-venv DIR [--install-nni]]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._home import use_own_home  # noqa: E402
from benchmarks._stats import print_table, summary_row  # noqa: E402
from benchmarks._venv import create_venv, nni_experiment  # noqa: E402
from trialflow.server.api_choice import set_process_defaults  # noqa: E402

TRIAL = "import time, nni\nnni.get_next_parameter()\ntime.sleep(0.5)\nnni.report_final_result(1.0)\n"


def bare_pool(code_dir: Path, trials: int, concurrency: int) -> float:
    from trialflow.trial import NNI_SHIM_DIR, RUNTIME_ROOT

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([NNI_SHIM_DIR, RUNTIME_ROOT])}
    cmd = [sys.executable, str(code_dir / "trial.py")]
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(lambda _: subprocess.run(cmd, env=env, check=True, capture_output=True), range(trials)))
    return time.perf_counter() - start


def trialflow_run(code_dir: Path, workdir: Path, trials: int, concurrency: int) -> tuple[float, float]:
    """(wall time of the trials, wall time including flow start-up)."""
    from trialflow import run_experiment

    config = {"searchSpace": {"x": {"_type": "uniform", "_value": [0, 1]}},
              "trialCommand": f"{sys.executable} trial.py", "trialCodeDirectory": str(code_dir),
              "trialConcurrency": concurrency, "maxTrialNumber": trials,
              "experimentWorkingDirectory": str(workdir), "tuner": {"name": "Random", "classArgs": {"seed": 0}},
              "trainingService": {"platform": "local"}}
    start = time.perf_counter()
    result = run_experiment(config)
    total = time.perf_counter() - start
    assert result.status == "DONE" and all(t.status == "SUCCEEDED" for t in result.trials), result.status
    first = min(t.submit_time for t in result.trials)
    last = max(t.end_time or 0 for t in result.trials)
    return last - first, total


def nni_run(venv: Path, code_dir: Path, workdir: Path, trials: int, concurrency: int) -> tuple[float, float]:
    """(wall time of the trials, wall time from `nnictl create` to DONE) on NNI 3.0's local platform."""
    python = venv / "bin" / "python"
    config = {"searchSpace": {"x": {"_type": "uniform", "_value": [0, 1]}}, "trialCommand": f"{python} trial.py",
              "trialCodeDirectory": str(code_dir), "trialConcurrency": concurrency, "maxTrialNumber": trials,
              "experimentWorkingDirectory": str(workdir), "tuner": {"name": "Random"},
              "trainingService": {"platform": "local"}}
    cfg = workdir / "nni-config.json"
    workdir.mkdir(parents=True, exist_ok=True)
    cfg.write_text(json.dumps(config))
    start = time.perf_counter()
    with nni_experiment(venv, cfg, workdir / "home") as port:
        api = f"http://127.0.0.1:{port}/api/v1/nni"
        deadline = time.monotonic() + 30 * 60
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"{api}/check-status", timeout=20) as resp:
                if json.load(resp)["status"] in ("DONE", "ERROR", "STOPPED"):
                    break
            time.sleep(0.5)
        total = time.perf_counter() - start
        with urllib.request.urlopen(f"{api}/trial-jobs", timeout=20) as resp:
            jobs = json.load(resp)
    done = [j for j in jobs if j.get("status") == "SUCCEEDED"]
    assert len(done) == trials, f"NNI finished {len(done)} of {trials} trials"
    return (max(j["endTime"] for j in done) - min(j["startTime"] for j in done)) / 1000, total


def install_nni(venv: Path) -> None:
    create_venv(venv, "nni==3.0")


def measure(trials: int, concurrency: int, nni_venv: Path | None = None) -> dict[str, float]:
    """Wall times (s) of the bare pool, trialflow (trials, and with start-up) and NNI 3.0 when given."""
    out: dict[str, float] = {"ideal": math.ceil(trials / concurrency) * 0.5}
    with tempfile.TemporaryDirectory() as tmp:
        code = Path(tmp) / "code"
        code.mkdir()
        (code / "trial.py").write_text(TRIAL)
        out["bare"] = bare_pool(code, trials, concurrency)
        out["trialflow"], out["trialflow_total"] = trialflow_run(code, Path(tmp) / "w", trials, concurrency)
        if nni_venv and (nni_venv / "bin" / "nnictl").exists():
            out["nni"], out["nni_total"] = nni_run(nni_venv, code, Path(tmp) / "nni", trials, concurrency)
    return out


def summary(profile: str, nni_venv: Path | None = None) -> list[list[object]]:
    """Rows for ``python -m benchmarks``."""
    trials = 80 if profile == "short" else 200
    m = measure(trials, 8, nni_venv)
    name = f"overhead ({trials} x 0.5 s, C=8)"
    rows = [summary_row(name, "trialflow local, wall", m["trialflow"], "s", "bare subprocess pool", m["bare"], 1.25),
            summary_row(name, "trialflow local, wall", m["trialflow"], "s", "ideal", m["ideal"])]
    if "nni" in m:
        rows.append(summary_row(name, "NNI 3.0 local, wall", m["nni"], "s", "bare subprocess pool", m["bare"]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--nni-venv", type=Path, help="virtualenv with nni==3.0 installed")
    parser.add_argument("--install-nni", action="store_true", help="create --nni-venv with nni==3.0 first")
    args = parser.parse_args()
    use_own_home()
    if args.install_nni and args.nni_venv and not (args.nni_venv / "bin" / "nnictl").exists():
        install_nni(args.nni_venv)
    set_process_defaults()  # as a trialflow command runs
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    m = measure(args.trials, args.concurrency, args.nni_venv)
    ideal, bare, trials_wall, total = m["ideal"], m["bare"], m["trialflow"], m["trialflow_total"]
    nni = (m["nni"], m["nni_total"]) if "nni" in m else None
    measured = [("bare subprocess pool", bare), ("trialflow (first submit -> last end)", trials_wall),
                ("trialflow (incl. Prefect start-up)", total)]
    if nni is not None:
        measured += [("NNI 3.0 (first start -> last end)", nni[0]), ("NNI 3.0 (nnictl create -> DONE)", nni[1])]
    rows = [[name, f"{wall:.1f}", f"{wall / ideal:.2f}x", f"{wall / bare:.2f}x"] for name, wall in measured]
    print_table(f"{args.trials} trials x 0.5 s at concurrency {args.concurrency} on the local service "
                f"(ideal {ideal:.1f} s)", ["runner", "wall s", "vs ideal", "vs bare pool"], rows)
    verdict = "PASS" if trials_wall / bare <= 1.25 else "OVER"
    print(f"\ntrialflow / bare pool = {trials_wall / bare:.2f} (target <= 1.25): {verdict}")


if __name__ == "__main__":
    main()
