"""CPU cost of one Prefect task run here, in the controller and in the (temporary) Prefect server:
N trivial task runs submitted from a flow beside N plain calls. The experiment flow runs three per
trial (suggest, submit, poll), so this is what the task graph adds to each trial.

    python benchmarks/task_cost.py [--runs 300]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._stats import print_table  # noqa: E402
from trialflow.server.api_choice import set_process_defaults  # noqa: E402


def _children_cpu() -> float:
    """CPU seconds of this process's live descendants (the temporary Prefect server), from /proc."""
    total, tick = 0.0, os.sysconf("SC_CLK_TCK")
    me = str(os.getpid())
    parents = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[pid] = (fields[1], (int(fields[11]) + int(fields[12])) / tick)
    for pid, (ppid, cpu) in parents.items():
        seen = ppid
        while seen in parents and seen != me:
            seen = parents[seen][0]
        if seen == me and pid != me:
            total += cpu
    return total


def measure(runs: int) -> list[list[object]]:
    from prefect import flow, task
    from prefect.cache_policies import NO_CACHE
    from prefect.task_runners import ThreadPoolTaskRunner

    @task(cache_policy=NO_CACHE, task_run_name="noop-{i}")
    def noop(experiment_id: str, i: int) -> int:
        return i

    @flow(task_runner=ThreadPoolTaskRunner(max_workers=8))
    def many(n: int) -> tuple[float, float, float]:
        noop("warm-up", -1)
        cpu0, server0, wall0 = time.process_time(), _children_cpu(), time.perf_counter()
        futures = [noop.submit("exp", i) for i in range(n)]
        for f in futures:
            f.wait()
        time.sleep(2.0)  # let the server take in the last state events
        return time.process_time() - cpu0, _children_cpu() - server0, time.perf_counter() - wall0 - 2.0

    controller, server, wall = many(runs)
    plain0 = time.process_time()
    for i in range(runs):
        noop.fn("exp", i)
    plain = time.process_time() - plain0
    per = 1000.0 / runs
    return [["controller CPU per task run", f"{controller * per:.2f} ms", f"plain call {plain * per:.3f} ms"],
            ["Prefect server CPU per task run", f"{server * per:.2f} ms", "-"],
            ["wall per task run (8 threads)", f"{wall * per:.2f} ms", "-"],
            ["per trial (3 task runs)", f"{3 * (controller + server) * per:.1f} ms CPU", "-"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()
    set_process_defaults()  # as a trialflow command runs
    rows = measure(args.runs)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    print_table(f"{args.runs} trivial task runs; controller peak RSS {rss} MB", ["measure", "value", "baseline"], rows)


if __name__ == "__main__":
    main()
