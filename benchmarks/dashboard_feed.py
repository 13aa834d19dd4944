"""What the live dashboard's feed costs per trial, against what the store itself spends on a trial.

The feed runs in the dashboard's process and only reads the store, so an experiment without a
dashboard pays nothing; this measures the dashboard's side: catching up with N finished trials
(first start), and following one trial at a time (each trial: start, K intermediate results, end),
into an Optuna journal file (the default) and into memory. Baseline, same run: the store writes of
the same trial. Medians of R rounds.

    python benchmarks/dashboard_feed.py [--trials 1000] [--steps 10] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import optuna  # noqa: E402

from trialflow import parse_config  # noqa: E402
from trialflow.experiments import create_experiment, open_store  # noqa: E402
from trialflow.presentation.dashboard import journal_storage, open_mirror  # noqa: E402
from trialflow.records.store import ExperimentStore, Metric  # noqa: E402

SPACE = {"x": {"_type": "uniform", "_value": [0, 1]}, "k": {"_type": "choice", "_value": [1, 2, 3]}}


def _one_trial(store: ExperimentStore, i: int, steps: int) -> None:
    trial = f"T{i:06d}"
    store.add_trial(trial, None, i, {"x": i / 1e6, "k": 1 + i % 3}, {})
    store.set_status(trial, "RUNNING")
    store.add_metrics([Metric(trial, "PERIODICAL", s, s / steps) for s in range(steps)])
    store.add_metrics([Metric(trial, "FINAL", 0, i / 1e6)])
    store.set_status(trial, "SUCCEEDED", 0)


def _round(root: Path, trials: int, steps: int, journal: bool) -> tuple[float, float, float]:
    config = {"searchSpace": SPACE, "trialCommand": "true", "trialConcurrency": 1, "tuner": {"name": "Random"},
              "trialCodeDirectory": str(root), "experimentWorkingDirectory": str(root / "w"),
              "trainingService": {"platform": "local"}}
    exp_id, exp_dir = create_experiment(parse_config(config))
    store = open_store(exp_dir.parent, exp_id)
    started = time.perf_counter()
    for i in range(trials):
        _one_trial(store, i, steps)
    store_cost = (time.perf_counter() - started) / trials
    storage = journal_storage(exp_dir) if journal else optuna.storages.InMemoryStorage()
    started = time.perf_counter()
    mirror = open_mirror(store, storage)
    mirror.sync()
    catch_up = (time.perf_counter() - started) / trials
    follow = []
    for i in range(trials, trials + 50):
        _one_trial(store, i, steps)
        started = time.perf_counter()
        mirror.sync()
        follow.append(time.perf_counter() - started)
    store.close()
    return store_cost, catch_up, statistics.median(follow)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for journal in (True, False):
        results = []
        for _ in range(args.rounds):
            with tempfile.TemporaryDirectory() as tmp:
                results.append(_round(Path(tmp), args.trials, args.steps, journal))
        store_cost, catch_up, follow = (statistics.median(column) for column in zip(*results, strict=True))
        kind = "journal file" if journal else "in memory"
        print(f"{kind:>12}: store writes {store_cost * 1e3:.2f} ms/trial (baseline); feed catch-up "
              f"{catch_up * 1e3:.2f} ms/trial ({catch_up / store_cost:.2f}x); feed following one trial "
              f"{follow * 1e3:.2f} ms ({follow / store_cost:.2f}x)  [{args.trials} trials x {args.steps} "
              f"intermediates, median of {args.rounds}]")


if __name__ == "__main__":
    main()
