"""An idle kept server's CPU: trialflow's kept Prefect server and Prefect's own ``prefect server start``
(the baseline: same Prefect, its defaults, SQLite), each in a throwaway home, started together and left
idle; their CPU-seconds per minute over the same windows once both have settled.

A kept server outlives experiments (it is kept for the next one, for days on a login node), so what
it spends doing nothing is paid for as long as it runs. Target: no more than Prefect's own server.

    python benchmarks/idle_server.py [--settle 30] [--windows 4] [--window 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._stats import print_table, summary_row  # noqa: E402
from benchmarks.scale import _session_cpu_seconds  # noqa: E402


def prefect_server(home: Path) -> subprocess.Popen[bytes]:
    """``prefect server start`` on a free loopback port, PREFECT_HOME ``home``, in a session of its own,
    once it answers."""
    from trialflow.testing.ports import answers_health, free_port, wait_serving

    port = free_port()
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    home.mkdir(parents=True)
    log = home / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                                 "--port", str(port), "--no-ui"], env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    wait_serving(lambda: answers_health(f"http://127.0.0.1:{port}/api/health"), proc, log, "prefect server", 120)
    return proc


def measure(settle: float, windows: int, window: float) -> dict[str, float]:
    """Median CPU-seconds per minute of each idle server (its session: for the kept server, its port
    keeper and the process serving the app) over ``windows`` windows of ``window`` s."""
    from trialflow.server.kept_server import ensure_server, stop_server

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "trialflow"
        baseline = prefect_server(Path(tmp) / "prefect")
        try:
            sessions = {"kept": ensure_server(home, port=0).pid, "prefect": baseline.pid}
            return cpu_per_minute(lambda: {name: _session_cpu_seconds(session) for name, session in sessions.items()},
                                  settle, windows, window)
        finally:
            stop_server(home)
            baseline.terminate()
            baseline.wait(timeout=60)


def cpu_per_minute(cpu: Callable[[], dict[str, float]], settle: float, windows: int, window: float
                   ) -> dict[str, float]:
    """Median CPU-seconds per minute of each part ``cpu`` reads (CPU-seconds so far, by part), over
    ``windows`` windows of ``window`` s after ``settle`` s."""
    time.sleep(settle)
    rates: dict[str, list[float]] = {}
    for _ in range(windows):
        before = cpu()
        time.sleep(window)
        for part, seconds in cpu().items():
            rates.setdefault(part, []).append((seconds - before[part]) * 60 / window)
    return {part: statistics.median(values) for part, values in rates.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settle", type=float, default=30.0, help="seconds after both serve, first")
    parser.add_argument("--windows", type=int, default=4)
    parser.add_argument("--window", type=float, default=30.0, help="seconds per window")
    args = parser.parse_args()
    result = measure(args.settle, args.windows, args.window)
    print_table("idle server, CPU-seconds per minute (median of windows)",
                ["bench", "measure", "value", "baseline", "base value", "ratio", "target", "verdict"],
                [summary_row("idle_server", "kept server idle", result["kept"], "CPU-s/min",
                             "prefect server start idle", result["prefect"], target=1.0)])


if __name__ == "__main__":
    main()
