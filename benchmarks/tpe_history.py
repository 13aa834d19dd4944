"""TPE's cost per suggestion as the history grows, and what its history window costs in search quality.

Cost: the median time of one suggest + observe of trialflow's TPE tuner holding 500 / 2,000 / 10,000
finished trials (replayed, as a resumed experiment's are), with the whole history (Optuna's sampler as it
is) and with the history window (``trialflow.tuners.tpe.HISTORY_WINDOW``), in the same run.
Quality: the best value found on Hartmann-6 (minimum -3.32237) by ``--trials`` sequential suggestions, both
ways, for ``--seeds`` seeds (median). Target (the listings-and-tuners issue): the cost flat as the history
grows, the best value no worse than the whole history's.

    python benchmarks/tpe_history.py [--points 500,2000,10000] [--trials 3000] [--seeds 3]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._stats import print_table  # noqa: E402
from trialflow.records.search_space import parse_search_space  # noqa: E402
from trialflow.tuners.optuna_tuners import OptunaTuner  # noqa: E402
from trialflow.tuners.tpe import TpeSettings  # noqa: E402

SPACE = parse_search_space({f"x{i}": {"_type": "uniform", "_value": [0, 1]} for i in range(6)})
_A = [[10, 3, 17, 3.5, 1.7, 8], [0.05, 10, 17, 0.1, 8, 14], [3, 3.5, 1.7, 10, 17, 8], [17, 8, 0.05, 10, 0.1, 14]]
_P = [[0.1312, 0.1696, 0.5569, 0.0124, 0.8283, 0.5886], [0.2329, 0.4135, 0.8307, 0.3736, 0.1004, 0.9991],
      [0.2348, 0.1451, 0.3522, 0.2883, 0.3047, 0.6650], [0.4047, 0.8828, 0.8732, 0.5743, 0.1091, 0.0381]]
_ALPHA = [1.0, 1.2, 3.0, 3.2]


def hartmann6(x: list[float]) -> float:
    return -sum(a * math.exp(-sum(_A[i][j] * (x[j] - _P[i][j]) ** 2 for j in range(6)))
                for i, a in enumerate(_ALPHA))


def tuner(seed: int, windowed: bool) -> OptunaTuner:
    settings = TpeSettings()
    return OptunaTuner(SPACE, settings.sampler, "minimize", seed, None,
                       settings.history_window() if windowed else None)


def cost_ms(n: int, windowed: bool, samples: int) -> float:
    """Median ms of suggest + observe with ``n`` finished trials replayed."""
    rng = random.Random(n)
    t = tuner(0, windowed)
    for i in range(n):
        raw = {f"x{k}": rng.random() for k in range(6)}
        t.replay(i, raw, hartmann6([raw[f"x{k}"] for k in range(6)]))
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        s = t.suggest()
        t.observe(s.parameter_id, hartmann6([s.parameters[f"x{k}"] for k in range(6)]))
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def search(seed: int, windowed: bool, trials: int) -> tuple[float, float]:
    """(best value, wall seconds) of ``trials`` sequential suggestions."""
    t, best, start = tuner(seed, windowed), math.inf, time.perf_counter()
    for _ in range(trials):
        s = t.suggest()
        value = hartmann6([s.parameters[f"x{k}"] for k in range(6)])
        best = min(best, value)
        t.observe(s.parameter_id, value)
    return best, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", default="500,2000,10000")
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--trials", type=int, default=3000)
    parser.add_argument("--seeds", type=int, default=3)
    opts = parser.parse_args()
    rows = []
    for n in (int(p) for p in opts.points.split(",")):
        whole, window = cost_ms(n, False, opts.samples), cost_ms(n, True, opts.samples)
        rows.append([f"{n:,}", f"{whole:.1f} ms", f"{window:.1f} ms", f"{window / whole:.2f}x"])
    print_table("TPE suggest + observe (median ms) by finished trials", ["finished", "whole history",
                "history window", "ratio"], rows)
    if opts.trials <= 0:
        return
    results: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for seed in range(opts.seeds):
        for windowed in (False, True):
            results[windowed].append(search(seed, windowed, opts.trials))
    rows = []
    for windowed, runs in results.items():
        rows.append(["history window" if windowed else "whole history", f"{statistics.median(b for b, _ in runs):.5f}",
                     " ".join(f"{b:.4f}" for b, _ in runs), f"{statistics.median(w for _, w in runs):.1f} s"])
    print_table(f"Hartmann-6 (min -3.32237): best of {opts.trials} sequential TPE suggestions, median of "
                f"{opts.seeds} seeds", ["TPE", "best (median)", "per seed", "wall (median)"], rows)


if __name__ == "__main__":
    main()
