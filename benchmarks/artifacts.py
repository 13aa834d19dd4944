"""Artifact versions of an 8-hour experiment, in compressed time.

An experiment runs ``--seconds`` (default 120) of short trials while the reporter's intervals are
divided by the compression factor (8 h / seconds): what an 8-hour experiment writes, written in two
minutes. Counts every version of the experiment's artifacts on the kept Prefect server, against the
target (<= 200) and against the former behaviour (a table and a summary version every 3 s: 19,200).

    python benchmarks/artifacts.py [--seconds 120]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._home import use_own_home  # noqa: E402
from benchmarks._stats import print_table, summary_row  # noqa: E402
from trialflow.server.api_choice import set_process_defaults  # noqa: E402

EIGHT_HOURS = 8 * 3600.0
FORMER_INTERVAL = 3.0  # seconds between table and summary versions before they were written on change


def measure(seconds: float) -> dict[str, int]:
    """Artifact versions by kind after a compressed 8-hour experiment."""
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from trialflow import run_experiment
    from trialflow.flows import artifacts as ui
    from trialflow.server.kept_server import ensure_server, stop_server

    factor = EIGHT_HOURS / seconds
    ui.PROGRESS_INTERVAL /= factor
    ui.SNAPSHOT_INTERVAL /= factor
    with tempfile.TemporaryDirectory() as tmp:
        code = Path(tmp) / "code"
        code.mkdir()
        (code / "trial.py").write_text("import random, time, nni\np = nni.get_next_parameter()\ntime.sleep(0.3)\n"
                                       "nni.report_final_result(random.random())\n")
        server = ensure_server(Path(tmp) / "home")
        try:
            with temporary_settings(updates={PREFECT_API_URL: server.url}):
                result = run_experiment({
                    "searchSpace": {"x": {"_type": "uniform", "_value": [0, 1]}},
                    "trialCommand": f"{sys.executable} trial.py", "trialCodeDirectory": str(code),
                    "trialConcurrency": 4, "maxTrialNumber": 100000, "maxExperimentDuration": f"{seconds:g}s",
                    "tuner": {"name": "Random"}, "trainingService": {"platform": "local"},
                    "experimentWorkingDirectory": str(Path(tmp) / "w")})
                key = f"experiment-{result.experiment_id}"
                with get_client(sync_client=True) as client:
                    counts = {kind: len(client.read_artifacts(artifact_filter=ArtifactFilter(
                        key=ArtifactFilterKey(any_=[f"{key}-{kind}"])))) for kind in ("progress", "trials", "best")}
        finally:
            stop_server(Path(tmp) / "home")
    counts["trials run"] = len(result.trials)
    return counts


def summary(profile: str) -> list[list[object]]:
    counts = measure(120.0 if profile == "short" else 480.0)
    total = counts["progress"] + counts["trials"] + counts["best"]
    return [summary_row("artifacts (8 h, compressed)", "artifact versions", total, "", "200 budget", 200.0, 1.0),
            summary_row("artifacts (8 h, compressed)", "artifact versions", total, "",
                        "a version every 3 s (before)", 2 * EIGHT_HOURS / FORMER_INTERVAL)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    args = parser.parse_args()
    use_own_home()
    set_process_defaults()  # as a trialflow command runs
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    counts = measure(args.seconds)
    total = counts["progress"] + counts["trials"] + counts["best"]
    print_table(f"artifact versions of an 8-hour experiment ({args.seconds:g} s at {EIGHT_HOURS / args.seconds:.0f}x, "
                f"{counts['trials run']} trials)", ["artifact", "versions"],
                [["progress (updated in place)", counts["progress"]], ["trials table", counts["trials"]],
                 ["best-trial summary", counts["best"]], ["total (target <= 200)", total],
                 ["before: a table and a summary every 3 s", int(2 * EIGHT_HOURS / FORMER_INTERVAL)]])


if __name__ == "__main__":
    main()
