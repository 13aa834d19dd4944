"""Experiment overhead on the local service: N trivial Python trials (sleep 0.5 s) at concurrency C.

Prints wall time / ideal (ceil(N/C) x 0.5 s) for trialflow (full experiment flow: tuner, store,
Prefect task runs, trial keeper) beside a bare ``subprocess`` pool running the same commands in the
same run, and the ratio between the two (target: trialflow within 1.25x of the bare pool).

    python benchmarks/overhead.py [--trials 200] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._stats import print_table  # noqa: E402

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_LOGGING_LEVEL", "CRITICAL")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    ideal = math.ceil(args.trials / args.concurrency) * 0.5
    with tempfile.TemporaryDirectory() as tmp:
        code = Path(tmp) / "code"
        code.mkdir()
        (code / "trial.py").write_text(TRIAL)
        bare = bare_pool(code, args.trials, args.concurrency)
        trials_wall, total = trialflow_run(code, Path(tmp) / "w", args.trials, args.concurrency)
    rows = [["bare subprocess pool", f"{bare:.1f}", f"{bare / ideal:.2f}x", "1.00x"],
            ["trialflow (first submit -> last end)", f"{trials_wall:.1f}", f"{trials_wall / ideal:.2f}x",
             f"{trials_wall / bare:.2f}x"],
            ["trialflow (incl. Prefect start-up)", f"{total:.1f}", f"{total / ideal:.2f}x", f"{total / bare:.2f}x"]]
    print_table(f"{args.trials} trials x 0.5 s at concurrency {args.concurrency} on the local service "
                f"(ideal {ideal:.1f} s)", ["runner", "wall s", "vs ideal", "vs bare pool"], rows)
    verdict = "PASS" if trials_wall / bare <= 1.25 else "OVER"
    print(f"\ntrialflow / bare pool = {trials_wall / bare:.2f} (target <= 1.25): {verdict}")


if __name__ == "__main__":
    main()
