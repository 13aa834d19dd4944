"""One entry point for every benchmark: ``python -m benchmarks [--profile short|full] [--only a,b]
[--nni-venv DIR] [--venv DIR]`` runs each with the chosen profile and prints one table: each measure beside the
baseline measured in the same run (bare subprocess pool, scp, Optuna in-memory ask/tell, NNI 3.0 when
``--nni-venv`` holds it, the ideal wall time), their ratio, and the verdict against the target.
Results recorded in ``benchmarks/README.md``."""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import (  # noqa: E402
    artifacts,
    chaos,
    metrics_throughput,
    overhead,
    scale,
    startup,
    tuner_latency,
    upload,
)
from benchmarks._home import use_own_home  # noqa: E402
from benchmarks._stats import print_table  # noqa: E402
from benchmarks._venv import add_venv_option, rerun_in  # noqa: E402
from trialflow.server.api_choice import set_process_defaults  # noqa: E402

HEADER = ["benchmark", "measure", "value", "baseline", "baseline value", "ratio", "target", "verdict"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=["short", "full"], default="short")
    parser.add_argument("--only", help="comma-separated subset of: overhead,tuner,upload,metrics,scale,chaos,"
                        "startup,artifacts")
    parser.add_argument("--nni-venv", type=Path,
                        help="virtualenv holding nni==3.0 (overhead and startup compare with it)")
    add_venv_option(parser)
    args = parser.parse_args()
    rerun_in(args.venv)
    use_own_home()
    set_process_defaults()  # as a trialflow command runs
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    suites: dict[str, Callable[[str], list[list[object]]]] = {
        "overhead": lambda p: overhead.summary(p, args.nni_venv), "tuner": tuner_latency.summary,
        "upload": upload.summary, "metrics": metrics_throughput.summary, "scale": scale.summary,
        "chaos": chaos.summary, "startup": lambda p: startup.summary(p, args.nni_venv),
        "artifacts": artifacts.summary}
    chosen = args.only.split(",") if args.only else list(suites)
    unknown = set(chosen) - set(suites)
    if unknown:
        parser.error(f"unknown benchmark(s) {sorted(unknown)}; choose from {', '.join(suites)}")
    rows: list[list[object]] = []
    failed = []
    started = time.perf_counter()
    for name in chosen:
        print(f"running {name} ({args.profile}) ...", file=sys.stderr, flush=True)
        try:
            rows += suites[name](args.profile)
        except Exception:  # noqa: BLE001 -- one broken benchmark must not hide the others' results
            traceback.print_exc()
            failed.append(name)
            rows.append([name, "did not complete (traceback above)", "-", "-", "-", "-", "-", "ERROR"])
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    machine = f"{platform.node()} ({os.cpu_count()} CPUs, Python {platform.python_version()})"
    print_table(f"trialflow benchmarks, {args.profile} profile, {when}, {machine}, "
                f"{time.perf_counter() - started:.0f} s", HEADER, rows)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
