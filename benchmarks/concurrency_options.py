"""How trialConcurrency is held: the experiment flow's bounded window against a Prefect global
concurrency limit (strict) around each trial, for N tasks of S seconds at concurrency K, on the
temporary server. The window is what trialflow uses for one experiment; Prefect's limit is what it
uses for caps shared across experiments (``platformConcurrency``).

    python benchmarks/concurrency_options.py [--tasks 96] [--concurrency 8] [--seconds 0.5] [--repeat 3]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._stats import print_table  # noqa: E402
from trialflow.server.api_choice import set_process_defaults  # noqa: E402


def measure(tasks: int, k: int, seconds: float, repeat: int) -> list[list[object]]:
    from prefect import flow, task
    from prefect.cache_policies import NO_CACHE
    from prefect.client.orchestration import get_client
    from prefect.concurrency.sync import concurrency
    from prefect.task_runners import ThreadPoolTaskRunner

    @task(cache_policy=NO_CACHE)
    def plain(i: int) -> int:
        time.sleep(seconds)
        return i

    @task(cache_policy=NO_CACHE)
    def limited(i: int) -> int:
        with concurrency("bench-trials", occupy=1, strict=True):
            time.sleep(seconds)
        return i

    @flow(task_runner=ThreadPoolTaskRunner(max_workers=k))
    def window() -> float:
        start = time.perf_counter()
        for f in [plain.submit(i) for i in range(tasks)]:
            f.wait()
        return time.perf_counter() - start

    @flow(task_runner=ThreadPoolTaskRunner(max_workers=tasks))
    def global_limit() -> float:
        start = time.perf_counter()
        for f in [limited.submit(i) for i in range(tasks)]:
            f.wait()
        return time.perf_counter() - start

    with get_client(sync_client=True) as client:
        client.upsert_global_concurrency_limit_by_name("bench-trials", k)
    ideal = math.ceil(tasks / k) * seconds
    walls = {"bounded window (ThreadPoolTaskRunner max_workers=K)": [window() for _ in range(repeat)],
             "Prefect global concurrency limit (strict)": [global_limit() for _ in range(repeat)]}
    base = statistics.median(next(iter(walls.values())))
    return [[name, f"{statistics.median(w):.2f} s", f"{statistics.median(w) / ideal:.2f}x",
             f"{statistics.median(w) / base:.2f}x"] for name, w in walls.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=96)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=0.5)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    set_process_defaults()  # as a trialflow command runs
    rows = measure(args.tasks, args.concurrency, args.seconds, args.repeat)
    ideal = math.ceil(args.tasks / args.concurrency) * args.seconds
    print_table(f"{args.tasks} tasks x {args.seconds} s at concurrency {args.concurrency} (ideal {ideal:.1f} s), "
                f"median of {args.repeat}", ["how", "wall", "vs ideal", "vs window"], rows)


if __name__ == "__main__":
    main()
