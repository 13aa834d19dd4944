"""Metrics stored per second, end to end, with 8 trials reporting as fast as they can.

Each trial (a real process in a TFJob pod of the Kubernetes emulator) reports ``--per-trial``
intermediate results in a tight loop through ``nni.report_intermediate_result``. The controller side
is the service's ``poll()`` (as the flow's trial tasks call it) plus the experiment store's
``add_metrics``: a metric counts when it is committed to the store. Three channels, measured in the
same run: HTTP push to the metrics receiver, the file on the shared storage, and pod logs only.

Printed per channel: metrics stored, wall time from the first submit to the last metric stored, and
the steady rate (from the first stored metric to the last). Target: >= 5,000 metrics/s over HTTP
(Ray Tune documents ~500 results/s per cluster as its comfort zone).

    python -m benchmarks.metrics_throughput [--trials 8] [--per-trial 20000]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from benchmarks._stats import print_table, summary_row
from trialflow.config import parse_config
from trialflow.experiments import create_experiment, open_store
from trialflow.platforms import TrialSpec, create_service
from trialflow.records.store import Metric
from trialflow.testing.emulators.kubernetes import KubernetesEmulator

TRIAL = """
import nni
nni.get_next_parameter()
for i in range({n}):
    nni.report_intermediate_result(i)
nni.report_final_result({n})
"""
NFS = ("nfs.bench.local", "/exports/nni")


def run_channel(root: Path, emulator: KubernetesEmulator, nfs: Path, channel: str, trials: int, per_trial: int
                ) -> tuple[int, float, float]:
    code = root / f"code-{channel}"
    code.mkdir()
    (code / "trial.py").write_text(TRIAL.format(n=per_trial))
    raw = {
        "searchSpace": {"x": {"_type": "uniform", "_value": [0, 1]}}, "trialCommand": "python3 trial.py",
        "trialCodeDirectory": str(code), "trialConcurrency": trials, "tuner": {"name": "Random"},
        "experimentWorkingDirectory": str(root / "w"),
        "trainingService": {
            "platform": "kubeflow", "operator": "tf-operator", "apiVersion": "v1", "metricChannel": channel,
            "reuseMode": False,
            "storage": {"storageType": "nfs", "server": NFS[0], "path": NFS[1], "localMountPoint": str(nfs)},
            "worker": {"replicas": 1, "command": "python3 trial.py", "cpuNumber": 1, "memorySize": "512mb"}},
    }
    config = parse_config(raw)
    exp_id, exp_dir = create_experiment(config)
    store = open_store(exp_dir.parent, exp_id)
    service = create_service(config.services[0], exp_dir)
    service.prepare()
    ref = service.upload_code(code)
    started = time.perf_counter()
    handles = [service.submit(TrialSpec(exp_id, f"T{i:04d}", i, i, {}, "python3 trial.py", code), ref)
               for i in range(trials)]
    cursors: dict[str, dict] = {h.trial_id: {} for h in handles}
    stored, first, live = 0, 0.0, list(handles)
    while live:
        for handle in list(live):
            update = service.poll(handle, cursors[handle.trial_id])
            cursors[handle.trial_id] = update.cursor
            if update.metrics:
                now = time.time()
                stored += store.add_metrics(Metric(handle.trial_id, r.type, r.sequence, r.value, now)
                                            for r in update.metrics)
                first = first or time.perf_counter()
            if update.status.is_terminal:
                if update.status.value != "SUCCEEDED":
                    raise SystemExit(f"trial {handle.trial_id} ended {update.status.value}: {update.message}")
                live.remove(handle)
        time.sleep(0.02)
    last = time.perf_counter()
    service.close()
    return stored, last - started, (stored / (last - first)) if last > first else 0.0


TARGET_PER_SECOND = 5000


def measure(trials: int, per_trial: int, channels: list[str]) -> dict[str, tuple[int, float, float]]:
    """Per channel: (metrics stored, wall s, steady metrics/s)."""
    out = {}
    with tempfile.TemporaryDirectory(prefix="tf-metrics-") as tmp:
        root = Path(tmp)
        nfs = root / "nfs"
        nfs.mkdir()
        with KubernetesEmulator(root / "cluster", {f"{NFS[0]}:{NFS[1]}": nfs}) as emulator:
            os.environ["KUBECONFIG"] = str(emulator.write_kubeconfig(root / "kubeconfig"))
            for channel in channels:
                out[channel] = run_channel(root, emulator, nfs, channel, trials, per_trial)
    return out


def summary(profile: str) -> list[list[object]]:
    """Rows for ``python -m benchmarks``: metrics/s end to end against the 5,000/s target."""
    trials, per_trial = (4, 5000) if profile == "short" else (8, 20000)
    rows = []
    for channel, (stored, wall, _) in measure(trials, per_trial, ["http", "file", "logs"]).items():
        rows.append(summary_row(f"metrics ({trials} x {per_trial:,} reports)", f"{channel} channel, end to end",
                                stored / wall, "/s", "target", TARGET_PER_SECOND, 1.0, higher_is_better=True))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--per-trial", type=int, default=20000)
    parser.add_argument("--channels", default="http,file,logs")
    args = parser.parse_args()
    rows = []
    for channel, (stored, wall, steady) in measure(args.trials, args.per_trial, args.channels.split(",")).items():
        expected = args.trials * (args.per_trial + 1)
        rows.append([channel, f"{stored}/{expected}", f"{wall:.2f}", f"{stored / wall:,.0f}", f"{steady:,.0f}"])
    print_table(f"Metrics stored per second, {args.trials} trials x {args.per_trial} reports (target >= 5,000/s "
                "over HTTP)", ["channel", "stored", "wall s", "metrics/s (wall)", "metrics/s (steady)"], rows)


if __name__ == "__main__":
    main()
