"""Chaos, the longer mode: an experiment of N short trials on the local service (or on a loopback
sshd with ``--remote``) while the controller (SIGKILL, then ``trialflow resume``), trial processes and
SSH connections are killed at moments drawn from ``--seed``; then every invariant of
``trialflow.testing.chaos`` is checked. Runs on the embedded Prefect server unless PREFECT_API_URL
is set. CI runs the short plan in ``tests/reliability/test_chaos.py``.

    python benchmarks/chaos.py [--trials 300] [--concurrency 6] [--seed 1] [--controller-kills 6]
                               [--trial-kills 20] [--ssh-drops 8] [--remote]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._stats import print_table, summary_row  # noqa: E402
from trialflow.server.api_choice import set_process_defaults  # noqa: E402


@dataclass
class ChaosResult:
    exit: int
    status: str
    wall: float
    actions: list[str]
    violations: dict[str, list[str]]
    trials: int
    succeeded: int
    metrics: int

    @property
    def ok(self) -> bool:
        return not self.violations and self.status == "DONE"


def run(trials: int, concurrency: int, seed: int, plan_args: dict[str, int], remote: bool) -> ChaosResult:
    from trialflow import parse_config
    from trialflow.experiments import create_experiment, open_store
    from trialflow.testing.chaos import (
        ChaosDriver,
        ChaosPlan,
        collect,
        leftover_processes,
        violations,
        write_chaos_trial,
    )
    from trialflow.testing.sshd import LoopbackSshd

    with tempfile.TemporaryDirectory(prefix="trialflow-chaos-") as tmp_name:
        tmp = Path(tmp_name)
        write_chaos_trial(tmp / "code", tmp / "runs.jsonl")
        servers: list[LoopbackSshd] = []
        service: dict[str, object] = {"platform": "local"}
        command = f"{sys.executable} trial.py"
        if remote:
            servers = [LoopbackSshd(tmp / f"sshd{i}").start() for i in range(2)]
            known = tmp / "known_hosts"
            known.write_text("".join(s.known_hosts.read_text() for s in servers))
            service = {"platform": "remote", "knownHostsFile": str(known), "machineList": [
                {"host": "127.0.0.1", "port": s.port, "user": s.user, "sshKeyFile": str(s.key_file),
                 "pythonPath": os.path.dirname(sys.executable), "remoteWorkingDirectory": str(tmp / f"remote{i}")}
                for i, s in enumerate(servers)]}
            command = "python3 trial.py"
        config = parse_config({
            "searchSpace": {"x": {"_type": "uniform", "_value": [0, 1]}}, "trialCommand": command,
            "trialCodeDirectory": str(tmp / "code"), "trialConcurrency": concurrency, "maxTrialNumber": trials,
            "experimentWorkingDirectory": str(tmp / "w"), "tuner": {"name": "Random", "classArgs": {"seed": seed}},
            "trainingService": service})
        exp_id, exp_dir = create_experiment(config)
        driver = ChaosDriver(exp_id, exp_dir.parent, ChaosPlan(**plan_args), seed, dict(os.environ), servers)
        start = time.perf_counter()
        try:
            code = driver.run(timeout=3600)
            wall = time.perf_counter() - start
            deadline = time.monotonic() + 30
            while leftover_processes(exp_id, tmp) and time.monotonic() < deadline:
                time.sleep(0.2)
            store = open_store(exp_dir.parent, exp_id)
            run_record = collect(store, tmp / "runs.jsonl", exp_dir / "trials", trials)
            found = violations(run_record)
            leftovers = leftover_processes(exp_id, tmp)
            if leftovers:
                found["no_orphans"] = leftovers
            statuses = list(run_record.trials.values())
            return ChaosResult(code, store.experiment().status, wall, driver.actions, found, len(statuses),
                               statuses.count("SUCCEEDED"), len(run_record.metrics))
        finally:
            for server in servers:
                server.stop()


def summary(profile: str) -> list[list[object]]:
    """Rows for ``python -m benchmarks``: a local chaos run; the ratio is violations per invariant run."""
    trials = 60 if profile == "short" else 300
    r = run(trials, 6, 1, {"controller_kills": 2 if profile == "short" else 6,
                           "trial_kills": 4 if profile == "short" else 20}, remote=False)
    kills = len([a for a in r.actions if "killed" in a])
    row = summary_row(f"chaos ({trials} trials, C=6, seed 1)", f"{kills} kills, {r.succeeded} succeeded",
                      float(len(r.violations)), "invariants broken", "-", None)
    row[-1] = "PASS" if r.ok else "FAIL"
    return [row]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=6)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--controller-kills", type=int, default=6)
    parser.add_argument("--trial-kills", type=int, default=20)
    parser.add_argument("--ssh-drops", type=int, default=8)
    parser.add_argument("--remote", action="store_true", help="trials on two loopback sshd machines")
    args = parser.parse_args()
    set_process_defaults()  # as a trialflow command runs
    r = run(args.trials, args.concurrency, args.seed, {"controller_kills": args.controller_kills,
                                                       "trial_kills": args.trial_kills,
                                                       "ssh_drops": args.ssh_drops if args.remote else 0}, args.remote)
    print_table(f"chaos: {args.trials} trials at concurrency {args.concurrency} on the "
                f"{'remote' if args.remote else 'local'} service, seed {args.seed}",
                ["measure", "value"],
                [["final status / last controller exit", f"{r.status} / {r.exit}"],
                 ["wall", f"{r.wall:.1f} s"], ["faults injected", len(r.actions)],
                 ["trials (succeeded)", f"{r.trials} ({r.succeeded})"], ["metrics stored", r.metrics],
                 ["invariant violations", r.violations or "none"]])
    for action in r.actions:
        print("  ", action)
    sys.exit(0 if r.ok else 1)


if __name__ == "__main__":
    main()
