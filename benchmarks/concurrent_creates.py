"""Several ``trialflow create`` at once on a warm kept server: each one's seconds from its start to its
first trial's process, against one ``create`` alone in the same run (the baseline).

People start several small sweeps at once from scripts and notebooks. On N cores, N creates at once
cost at most the CPU of N creates; ``--creates`` above the core count shares the cores, so the ratio
is judged against ``creates / cores`` (target: within 1.5x of that share, and never worse than
starting them one after another).

    python benchmarks/concurrent_creates.py [--creates 3] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._stats import print_table, summary_row  # noqa: E402
from benchmarks.startup import TRIALFLOW, _env, _first_trial_after, _wait_done, _write_experiment  # noqa: E402


def creates_at_once(tmp: Path, home: Path, count: int, tag: str) -> list[float]:
    """Start ``count`` background creates together; seconds from the start to each one's first trial."""
    folders = [tmp / f"{tag}-{i}" for i in range(count)]
    stamps = [folder / "stamp" for folder in folders]
    configs = [_write_experiment(folder, stamp) for folder, stamp in zip(folders, stamps, strict=True)]
    start = time.time()
    procs = [subprocess.Popen([*TRIALFLOW, "create", "--config", str(config)], env=_env(home),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for config in configs]
    try:
        return [_first_trial_after(start, stamp) for stamp in stamps]
    finally:
        for proc in procs:
            proc.wait(timeout=120)
        for folder in folders:
            _wait_done(folder, home)


def measure(creates: int, repeat: int) -> dict[str, float]:
    from trialflow.server.kept_server import ensure_server, stop_server

    alone: list[float] = []
    together: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        ensure_server(home)
        try:
            creates_at_once(Path(tmp), home, 1, "warm-up")  # the first experiment's one-time costs
            for i in range(repeat):
                alone += creates_at_once(Path(tmp), home, 1, f"alone-{i}")
                together += creates_at_once(Path(tmp), home, creates, f"together-{i}")
        finally:
            stop_server(home)
    return {"alone": statistics.median(alone), "together": statistics.median(together),
            "slowest together": max(together)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--creates", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    f = measure(args.creates, args.repeat)
    cores = os.cpu_count() or 1
    share = max(1.0, args.creates / cores)
    name = "concurrent creates"
    rows = [summary_row(name, f"{args.creates} creates at once, median to first trial", f["together"], "s",
                        "one create alone", f["alone"], 1.5 * share),
            summary_row(name, f"{args.creates} creates at once, slowest to first trial", f["slowest together"], "s",
                        "creates one after another", f["alone"] * args.creates, 1.0)]
    print_table(f"{args.creates} creates at once on {cores} cores (medians of {args.repeat})",
                ["bench", "measure", "value", "baseline", "baseline value", "ratio", "target", "verdict"], rows)


if __name__ == "__main__":
    main()
