"""Interruptions under chaos: an experiment of N checkpointing trials on the Kubernetes emulator while
a seeded scheduler disrupts ``--fraction`` of the trials' first runs at random moments (Kubernetes'
own reasons: preemption by priority, a NoExecute taint, the Eviction API, the kubelet), and the same
on the loopback Slurm cluster with ``scontrol requeue`` (``--slurm``).

Each trial trains ``--steps`` steps of ``--step-seconds``, saves its step to
``$TRIALFLOW_CHECKPOINT_DIR`` every ``--checkpoint-every`` steps and logs every step it finished to a
shared file. Measured: trials lost (not SUCCEEDED), failures told to the tuner (trials whose final
result is not the one their parameters give, or FAILED), interrupted runs and their resubmissions,
steps repeated per interruption (at most one checkpoint interval is the target), intermediate
sequences that are not 0..n-1 once each, and the experiment-record audit. The baseline in the same
run is the chaos-free experiment's wall time.

    python benchmarks/interruptions.py [--trials 200] [--concurrency 8] [--fraction 0.3] [--seed 1]
        [--steps 8] [--step-seconds 0.1] [--checkpoint-every 2] [--kind tfjob|framework] [--slurm]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._home import use_own_home  # noqa: E402
from benchmarks._stats import print_table  # noqa: E402
from trialflow.server.api_choice import set_process_defaults  # noqa: E402

NFS_SERVER, NFS_PATH = "nfs.emulated", "/exports/nni"
REASONS = ("PreemptionByScheduler", "DeletionByTaintManager", "EvictionByEvictionAPI", "TerminationByKubelet")
TRIAL = """\
import json, os, time
import nni

p = nni.get_next_parameter()
checkpoint = os.environ["TRIALFLOW_CHECKPOINT_DIR"]
mark = os.path.join(checkpoint, "step")
start = int(open(mark).read()) if os.path.exists(mark) else 0
with open({log!r}, "a") as log:
    for step in range(start, {steps}):
        time.sleep({step_seconds})
        log.write(json.dumps({{"trial": nni.get_trial_id(), "attempt": os.environ["TRIALFLOW_ATTEMPT"],
                              "step": step}}) + "\\n")
        log.flush()
        nni.report_intermediate_result(p["x"] + step)
        if (step + 1) % {every} == 0:
            with open(mark + ".tmp", "w") as f:
                f.write(str(step + 1))
            os.replace(mark + ".tmp", mark)
nni.report_final_result(p["x"] * 10)
"""


@dataclass
class Outcome:
    wall: float
    status: str
    trials: int
    lost: int
    false_failures: int
    interruptions: int
    repeated_steps: list[int]
    bad_sequences: int
    audit: list[str]
    injected: int
    actions: list[str] = field(default_factory=list)


class Scheduler:
    """Disrupts a seeded ``fraction`` of first runs, each at a seeded moment of its run; ``disrupt(target)``
    is the platform's way, ``running()`` the first runs to choose from (an id per run)."""

    def __init__(self, fraction: float, seed: int, window: float, running: Any, disrupt: Any) -> None:
        self.rng = random.Random(seed)
        self.fraction, self.window = fraction, window
        self.running, self.disrupt = running, disrupt
        self.stop = threading.Event()
        self.seen: set[str] = set()
        self.actions: list[str] = []
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        due: dict[str, tuple[float, Any]] = {}
        while not self.stop.wait(0.05):
            for ident, target in self.running().items():
                if ident not in self.seen:
                    self.seen.add(ident)
                    if self.rng.random() < self.fraction:
                        due[ident] = (time.monotonic() + self.rng.uniform(0.05, self.window), target)
            for ident, (when, target) in list(due.items()):
                if time.monotonic() >= when:
                    del due[ident]
                    try:
                        self.actions.append(f"{ident}: {self.disrupt(target, self.rng)}")
                    except LookupError:  # it ended first
                        pass


def _measure(store: Any, steps_log: Path, steps: int, injected: int, wall: float, actions: list[str]) -> Outcome:
    from trialflow.platforms.base import stored_attempt
    from trialflow.testing.audit import check_store

    trials = store.trials()
    done = collections.Counter(json.loads(line)["trial"] for line in steps_log.read_text().splitlines())
    lost = sum(t.status != "SUCCEEDED" for t in trials)
    false = sum(t.status == "FAILED" or t.final != t.parameters["x"] * 10 for t in trials)
    attempts = {t.id: stored_attempt(t.handle) for t in trials}
    repeated = [(done[t.id] - steps) for t in trials if attempts[t.id]]
    bad = 0
    for trial in trials:
        sequences = [m.sequence for m in store.metrics(trial.id, "PERIODICAL")]
        bad += sequences != list(range(len(sequences))) or len(sequences) < steps
    return Outcome(wall, store.experiment().status, len(trials), lost, false, sum(attempts.values()), repeated, bad,
                   check_store(store), injected, actions)


def _config(tmp: Path, trials: int, concurrency: int, seed: int, section: dict[str, Any], args: Any,
            label: str) -> tuple[dict[str, Any], Path]:
    """The experiment's config, and the file its trials log their steps to."""
    code = tmp / f"code-{label}"
    code.mkdir()
    log = tmp / f"steps-{label}.jsonl"
    log.touch()
    (code / "trial.py").write_text(TRIAL.format(log=str(log), steps=args.steps, step_seconds=args.step_seconds,
                                                every=args.checkpoint_every))
    return {"searchSpace": {"x": {"_type": "uniform", "_value": [0, 1]}}, "trialCommand": "python3 trial.py",
            "trialCodeDirectory": str(code), "trialConcurrency": concurrency, "maxTrialNumber": trials,
            "experimentWorkingDirectory": str(tmp / f"w-{label}"), "tuner": {"name": "Random",
                                                                             "classArgs": {"seed": seed}},
            "trainingService": section}, log


def _run(made: tuple[dict[str, Any], Path], scheduler: Scheduler | None, args: Any) -> Outcome:
    from trialflow import parse_config, run_experiment
    from trialflow.experiments import open_store

    config, log = made
    if scheduler is not None:
        scheduler.thread.start()
    start = time.perf_counter()
    try:
        result = run_experiment(parse_config(config))
    finally:
        if scheduler is not None:
            scheduler.stop.set()
            scheduler.thread.join()
    wall = time.perf_counter() - start
    store = open_store(Path(config["experimentWorkingDirectory"]), result.experiment_id)
    actions = scheduler.actions if scheduler is not None else []
    return _measure(store, log, args.steps, len(actions), wall, actions)


def _chaos_and_calm(tmp: Path, section: dict[str, Any], args: Any, running: Any, disrupt: Any
                    ) -> tuple[Outcome, Outcome]:
    """A warm-up (the Prefect server's start), the run with disruptions, then the same without."""
    _run(_config(tmp, 2, 2, args.seed, section, args, "warm-up"), None, args)
    scheduler = Scheduler(args.fraction, args.seed, args.steps * args.step_seconds, running, disrupt)
    chaos = _run(_config(tmp, args.trials, args.concurrency, args.seed, section, args, "chaos"), scheduler, args)
    calm = _run(_config(tmp, args.trials, args.concurrency, args.seed, section, args, "calm"), None, args)
    return calm, chaos


def kubernetes(args: Any, tmp: Path) -> tuple[Outcome, Outcome]:
    """(the chaos-free run, the run with disruptions) on the emulator."""
    from trialflow.testing.emulators.kubernetes import KubernetesEmulator

    nfs = tmp / "nfs"
    nfs.mkdir()
    emulator = KubernetesEmulator(tmp / "cluster", {f"{NFS_SERVER}:{NFS_PATH}": nfs}, kill_grace=args.grace).start()
    os.environ["KUBECONFIG"] = str(emulator.write_kubeconfig(tmp / "kubeconfig"))
    storage = {"storageType": "nfs", "server": NFS_SERVER, "path": NFS_PATH, "localMountPoint": str(nfs)}
    role = {"command": "python3 trial.py", "cpuNumber": 1, "memorySize": "512mb", "gpuNumber": 0}
    if args.kind == "tfjob":
        section = {"platform": "kubeflow", "operator": "tf-operator", "apiVersion": "v1", "storage": storage,
                   "worker": {"replicas": 1, **role}, "reuseMode": False, "priorityClassName": "preemptible"}
        plural = "tfjobs"
    else:
        section = {"platform": "frameworkcontroller", "storage": storage, "reuseMode": False,
                   "priorityClassName": "preemptible",
                   "taskRoles": [{"name": "worker", "taskNumber": 1, **role,
                                  "frameworkAttemptCompletionPolicy": {"minFailedTaskCount": 1,
                                                                       "minSucceedTaskCount": 1}}]}
        plural = "frameworks"

    def first_runs() -> dict[str, str]:
        """Running pods of trials' first runs (a job named after the trial id alone), by trial."""
        jobs = {j["metadata"]["name"]: j["metadata"]["labels"].get("trialId") for j in emulator.objects(plural)}
        out = {}
        for pod in emulator.objects("pods"):
            owner = pod["metadata"]["ownerReferences"][0]["name"]
            trial = jobs.get(owner)
            if trial and pod["status"]["phase"] == "Running" and owner.endswith(trial):
                out[trial] = pod["metadata"]["name"]
        return out

    def disrupt(pod: str, rng: random.Random) -> str:
        reason = rng.choice(REASONS)
        emulator.disrupt(pod, reason=reason, message="chaos")
        return f"{reason} on {pod}"

    try:
        return _chaos_and_calm(tmp, section, args, first_runs, disrupt)
    finally:
        emulator.stop()


def slurm(args: Any, tmp: Path) -> tuple[Outcome, Outcome]:
    """(the chaos-free run, the run with ``scontrol requeue``) on the loopback Slurm cluster."""
    from trialflow.experiments import open_store
    from trialflow.testing.slurm import LoopbackSlurm

    cluster = LoopbackSlurm(tmp / "slurm").start()
    os.environ["SLURM_CONF"] = str(cluster.conf)
    section = {"platform": "slurm", "remoteWorkingDirectory": str(tmp / "cluster-work"),
               "pythonPath": os.path.dirname(sys.executable), "timeLimit": "10"}
    stores: list[Any] = []

    def first_runs() -> dict[str, str]:
        if not stores:
            roots = list((tmp / "w-chaos").glob("*/db"))
            if not roots:
                return {}
            stores.append(open_store(tmp / "w-chaos", roots[0].parent.name))
        return {t.id: t.handle["data"]["job_id"] for t in stores[0].trials()
                if t.status == "RUNNING" and t.handle and not t.handle["data"].get("attempt")
                and t.handle["data"].get("job_id")}

    def requeue(job_id: str, rng: random.Random) -> str:
        cluster.run("scontrol", "requeue", job_id)
        return f"scontrol requeue {job_id}"

    try:
        return _chaos_and_calm(tmp, section, args, first_runs, requeue)
    finally:
        cluster.stop()


def _rows(calm: Outcome, chaos: Outcome, every: int) -> list[list[object]]:
    repeated = chaos.repeated_steps
    return [
        ["trials; disruptions injected; runs they ended (resubmitted)",
         f"{chaos.trials}; {chaos.injected}; {chaos.interruptions} (the rest ended first)"],
        ["trials lost (not SUCCEEDED)", chaos.lost],
        ["false failures told to the tuner", chaos.false_failures],
        ["steps repeated per interrupted trial: median / max (target <= one checkpoint interval)",
         f"{sorted(repeated)[len(repeated) // 2] if repeated else 0} / {max(repeated, default=0)} (<= {every})"],
        ["intermediate series not 0..n-1 once each", chaos.bad_sequences],
        ["audit problems", len(chaos.audit)],
        ["wall: chaos / chaos-free (ratio)", f"{chaos.wall:.1f} s / {calm.wall:.1f} s ({chaos.wall / calm.wall:.2f}x)"],
        ["chaos-free run: lost / false failures / audit", f"{calm.lost} / {calm.false_failures} / {len(calm.audit)}"],
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--fraction", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--step-seconds", type=float, default=0.2)
    parser.add_argument("--grace", type=float, default=0.2, help="the emulated pods' termination grace period (s)")
    parser.add_argument("--checkpoint-every", type=int, default=2)
    parser.add_argument("--kind", choices=["tfjob", "framework"], default="tfjob")
    parser.add_argument("--slurm", action="store_true", help="also on the loopback Slurm cluster (scontrol requeue)")
    args = parser.parse_args()
    use_own_home()
    set_process_defaults()  # as a trialflow command runs
    ok = True
    with tempfile.TemporaryDirectory(prefix="trialflow-interruptions-") as name:
        runs = [("kubernetes emulator, " + args.kind, kubernetes, Path(name) / "k8s")]
        if args.slurm:
            runs.append(("loopback Slurm, scontrol requeue", slurm, Path(name) / "slurm"))
        for title, fn, tmp in runs:
            tmp.mkdir()
            calm, chaos = fn(args, tmp)
            print_table(f"interruptions on the {title}: {args.trials} trials at concurrency {args.concurrency}, "
                        f"{args.fraction:.0%} of first runs disrupted (seed {args.seed}), {args.steps} steps of "
                        f"{args.step_seconds} s, a checkpoint every {args.checkpoint_every}",
                        ["measure", "value"], _rows(calm, chaos, args.checkpoint_every))
            for problem in chaos.audit[:10]:
                print("   audit:", problem)
            ok = ok and not (chaos.lost or chaos.false_failures or chaos.bad_sequences or chaos.audit) and \
                max(chaos.repeated_steps, default=0) <= args.checkpoint_every
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
