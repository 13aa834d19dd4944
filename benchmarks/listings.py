"""The read-only commands on a large experiment: ``trialflow trial ls`` (all, and ``--head 10``),
``experiment export`` (CSV) and ``experiment list`` on an experiment of ``--trials`` finished trials
(10 intermediate results and a final each, written straight to its store: no trials run), each the
median of ``--runs`` cold processes (bytecode cached, as installed), against ``trialflow --help`` (the
CLI's start-up) in the same run.
Target (the listings issue): ``trial ls`` and ``export`` <= 0.5 s at 10,000 trials.

    python benchmarks/listings.py [--trials 10000] [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._stats import print_table  # noqa: E402

CONFIG = """\
experimentName: listings
searchSpace:
  lr: {_type: uniform, _value: [0.0, 1.0]}
trialCommand: python3 trial.py
trialConcurrency: 8
maxTrialNumber: 100000
tuner: {name: TPE, classArgs: {optimize_mode: maximize}}
trialCodeDirectory: .
experimentWorkingDirectory: ./w
trainingService: {platform: local}
"""


def fill(workdir: Path, trials: int) -> str:
    """An experiment under ``workdir/w`` holding ``trials`` finished trials; returns its id."""
    from trialflow.config.experiment import load_config
    from trialflow.experiments import create_experiment
    from trialflow.records.store import ExperimentStore, Metric

    (workdir / "config.yml").write_text(CONFIG)
    exp_id, exp_dir = create_experiment(load_config(workdir / "config.yml"), str(workdir / "config.yml"))
    store = ExperimentStore.embedded(exp_dir, exp_id)
    rng = random.Random(1)
    for i in range(trials):
        trial_id, x, now = f"S{i:05d}", rng.random(), time.time()
        store.add_trial(trial_id, None, i, {"lr": x}, {"lr": x}, str(exp_dir / "trials" / trial_id))
        store.set_started(trial_id, now)
        store.add_metrics([Metric(trial_id, "PERIODICAL", s, x * s, now) for s in range(10)]
                          + [Metric(trial_id, "FINAL", 0, x * 10, now)])
        store.set_status(trial_id, "SUCCEEDED", 0)
    store.set_experiment(status="DONE")
    store.close()
    return exp_id


def cold_seconds(args: list[str], runs: int, env: dict[str, str]) -> float:
    """Median wall seconds of ``trialflow <args>`` in a fresh process (output discarded)."""
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "from trialflow.console_script import main; main()", *args],
                       check=True, stdout=subprocess.DEVNULL, env=env, timeout=600)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=10000)
    parser.add_argument("--runs", type=int, default=5)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        env = {**os.environ, "HOME": str(workdir / "home"), "TRIALFLOW_HOME": str(workdir / "w")}
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # compiled modules cached, as an installed trialflow has them
        os.environ.update(env)
        os.chdir(workdir)
        start = time.perf_counter()
        exp_id = fill(workdir, opts.trials)
        print(f"{opts.trials} trials written in {time.perf_counter() - start:.1f} s")
        root = ["--root", str(workdir / "w")]
        base = cold_seconds(["--help"], opts.runs, env)
        rows = [["trialflow --help (baseline)", f"{base:.2f} s", "-", "-"]]
        for label, args, target in (
                ("trial ls", ["trial", "ls", exp_id, *root], 0.5),
                ("trial ls --head 10", ["trial", "ls", exp_id, "--head", "10", *root], None),
                ("experiment export (csv)", ["experiment", "export", exp_id, *root, "-t", "csv", "-f",
                                             str(workdir / "export.csv")], 0.5),
                ("experiment list", ["experiment", "list"], None)):
            seconds = cold_seconds(args, opts.runs, env)
            verdict = "-" if target is None else ("PASS" if seconds <= target else "OVER") + f" (<= {target} s)"
            rows.append([label, f"{seconds:.2f} s", f"{seconds / base:.2f}x", verdict])
    print_table(f"read-only commands at {opts.trials} trials (median of {opts.runs} cold processes)",
                ["command", "wall", "vs --help", "target"], rows)


if __name__ == "__main__":
    main()
