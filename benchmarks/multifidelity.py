"""Search efficiency at equal budget: trialflow's Random, TPE, Hyperband, BOHB, TPE + ASHA and PBT beside
Ray Tune's ASHA, HyperBand and BOHB (``--ray-venv``) and NNI 3.0's Hyperband and BOHB (``--nni-venv``).

The workload is synthetic and seeded: a configuration (learning rate, momentum, batch size) has a
quality ceiling and a learning speed, and its value after ``t`` training steps is
``ceiling * (1 - exp(-speed * t))`` plus small seeded noise; each step sleeps ``--step-seconds``. Every
method draws from one budget of ``--budget`` steps in total (a locked counter file the trials share,
whatever runs them) at ``--concurrency`` trials at once; once the budget is spent the method is
stopped. Trials continue from a checkpoint where the method hands one over (PBT, Ray's paused
trials); NNI's Hyperband and BOHB restart a promoted configuration at its larger budget, as their
trial contract says.

trialflow's tuners and Ray's random search and BOHB draw from the seed, so a seed draws the same
configurations in every run (NNI's advisors take no seed). Per method, medians over ``--seeds`` seeds:
the best value any step reached, the wall time until the budget was spent (from the method's own
start command: ``trialflow create``, ``nnictl create``, ``ray.init``), and the time until a step first
reached ``--target``; each beside trialflow's counterpart (Ray's and NNI's ASHA / Hyperband / BOHB
against trialflow's TPE + ASHA / Hyperband / BOHB; trialflow's own rows against its Random) as a ratio.

    python benchmarks/multifidelity.py [--seeds 5] [--budget 240] [--concurrency 4]
        [--ray-venv DIR [--install-ray]] [--nni-venv DIR [--install-nni]] [--only hyperband,bohb,...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._budget import Runner, prepare, run_seeds, run_trialflow, wait_spent  # noqa: E402
from benchmarks._home import use_own_home  # noqa: E402
from benchmarks._stats import print_table  # noqa: E402
from benchmarks._venv import create_venv, nni_experiment  # noqa: E402
from benchmarks.overhead import install_nni  # noqa: E402
from trialflow.server.api_choice import set_process_defaults  # noqa: E402

MAX_STEPS = 27  # R / max_budget / max_t: the longest a trial trains
# ASHA's rungs (trialflow's assessor and Ray's scheduler alike): 3, 9 and 27 steps. Spaced 6 steps or
# more apart, so a trial stopped late at a rung never ends on the next one: its steps past the rung
# it was stopped at are its steps past the last rung it reached
ASHA_GRACE = 3
ASHA_RUNGS = (3, 9, 27)
PBT_STEPS = 3  # steps per PBT generation
SPACE = {"lr": {"_type": "loguniform", "_value": [1e-4, 1.0]},
         "momentum": {"_type": "uniform", "_value": [0.0, 1.0]},
         "batch": {"_type": "choice", "_value": [16, 32, 64, 128]}}

# Standard library only: trialflow's and NNI's trials import it, and Ray's driver in its own venv.
WORKLOAD = '''
import fcntl, json, math, os, random, time

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = json.load(open(os.path.join(HERE, "mf_run.json")))
MAX_STEPS = RUN["max_steps"]


def quality(p):
    """The ceiling: 1.0 at lr 0.01, momentum 0.9, batch 64."""
    penalty = {16: 0.06, 32: 0.02, 64: 0.0, 128: 0.03}[int(p["batch"])]
    return max(0.0, 1.0 - (math.log10(p["lr"]) + 2) ** 2 / 1.5 - 2 * (p["momentum"] - 0.9) ** 2 - penalty)


def value(p, t):
    speed = 0.06 + 0.3 * min(1.0, p["lr"] * 20)
    noise = random.Random(hash((RUN["seed"], round(p["lr"], 9), round(p["momentum"], 9), int(p["batch"]), t)))
    return quality(p) * (1 - math.exp(-speed * t)) + noise.gauss(0, 0.003)


def step(p, t):
    """Train step t (1-based) of p: None once the shared budget is spent, else the value."""
    with open(os.path.join(RUN["run_dir"], "budget.lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        counter = os.path.join(RUN["run_dir"], "steps")
        used = int(open(counter).read() or 0) if os.path.exists(counter) else 0
        if used >= RUN["budget"]:
            return None
        with open(counter + ".new", "w") as f:  # replaced whole: a trial killed mid-write never empties it
            f.write(str(used + 1))
        os.replace(counter + ".new", counter)
        # a trial is its id (trialflow, NNI) or its configuration (Ray: one trial per sampled configuration)
        trial = os.environ.get("NNI_TRIAL_JOB_ID") or json.dumps(p, sort_keys=True, default=str)
        with open(os.path.join(RUN["run_dir"], "began.jsonl"), "a") as f:  # a step begun is budget spent
            f.write(json.dumps({"trial": trial, "t": t}) + "\\n")
    time.sleep(RUN["step_seconds"])
    v = value(p, t)
    with open(os.path.join(RUN["run_dir"], "log.jsonl"), "a") as f:
        f.write(json.dumps({"time": time.time(), "value": v, "used": used + 1, "trial": trial, "t": t}) + "\\n")
    return v
'''

NNI_TRIAL = '''
import json, os, nni
from workload import MAX_STEPS, step
p = nni.get_next_parameter()
steps = int(p.get("TRIAL_BUDGET", MAX_STEPS))
t, last = 0, None
load = p.get("load_checkpoint_dir")
if load and os.path.isfile(os.path.join(load, "state.json")):
    t = json.load(open(os.path.join(load, "state.json")))["t"]
for _ in range(int(p.get("PBT_STEPS", 0)) or max(steps - t, 0)):  # a promoted configuration trains the rest
    v = step(p, t + 1)
    if v is None:
        break
    t, last = t + 1, v
    nni.report_intermediate_result(v)
if "save_checkpoint_dir" in p:
    os.makedirs(p["save_checkpoint_dir"], exist_ok=True)
    json.dump({"t": t}, open(os.path.join(p["save_checkpoint_dir"], "state.json"), "w"))
nni.report_final_result(last if last is not None else 0.0)
'''

RAY_DRIVER = '''
import json, os, sys, tempfile, time
start = time.time()
import ray
from ray import tune
from ray.tune import Checkpoint
sys.path.insert(0, sys.argv[1])
from workload import MAX_STEPS, RUN, step

method, concurrency = sys.argv[2], int(sys.argv[3])


def trainable(config):
    t = 0
    ckpt = tune.get_checkpoint()
    if ckpt:
        with ckpt.as_directory() as d:
            t = json.load(open(os.path.join(d, "state.json")))["t"]
    while t < MAX_STEPS:
        v = step(config, t + 1)
        if v is None:
            return
        t += 1
        with tempfile.TemporaryDirectory() as d:
            json.dump({"t": t}, open(os.path.join(d, "state.json"), "w"))
            tune.report({"v": v}, checkpoint=Checkpoint.from_directory(d))


class Budget(tune.Stopper):
    def __call__(self, trial_id, result):
        return False

    def stop_all(self):
        path = os.path.join(RUN["run_dir"], "steps")
        return os.path.exists(path) and int(open(path).read() or 0) >= RUN["budget"]


space = {"lr": tune.loguniform(1e-4, 1.0), "momentum": tune.uniform(0.0, 1.0), "batch": tune.choice([16, 32, 64, 128])}
# Ray's random search as Tuner makes it (at most `concurrency` trials at once), seeded as trialflow's tuners
# are: a seed's draws are the same in every run
from ray.tune.search import BasicVariantGenerator
search = BasicVariantGenerator(max_concurrent=concurrency, random_state=RUN["seed"])
if method == "asha":
    scheduler = tune.schedulers.ASHAScheduler(max_t=MAX_STEPS, grace_period=RUN["asha_grace"], reduction_factor=3)
elif method == "hyperband":
    scheduler = tune.schedulers.HyperBandScheduler(max_t=MAX_STEPS, reduction_factor=3)
else:
    from ray.tune.search.bohb import TuneBOHB
    scheduler = tune.schedulers.HyperBandForBOHB(max_t=MAX_STEPS, reduction_factor=3)
    search = TuneBOHB(seed=RUN["seed"])
ray.init(num_cpus=concurrency, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
         runtime_env={"env_vars": {"PYTHONPATH": sys.argv[1]}})
tuner = tune.Tuner(tune.with_resources(trainable, {"cpu": 1}), param_space=space,
                   tune_config=tune.TuneConfig(metric="v", mode="max", scheduler=scheduler, search_alg=search,
                                               num_samples=100000, max_concurrent_trials=concurrency),
                   run_config=tune.RunConfig(stop=Budget(), storage_path=os.path.join(RUN["run_dir"], "ray"),
                                             verbose=0, failure_config=tune.FailureConfig(fail_fast=True)))
tuner.fit()
print(json.dumps({"start": start}))
'''


def _prepare(root: Path, name: str, seed: int, args: argparse.Namespace) -> tuple[Path, Path]:
    return prepare(root, name, seed, {"workload.py": WORKLOAD, "trial.py": NNI_TRIAL}, "mf_run.json",
                   {"budget": args.budget, "seed": seed, "step_seconds": args.step_seconds, "max_steps": MAX_STEPS,
                    "asha_grace": ASHA_GRACE})


def _outcome(run_dir: Path, start: float, args: argparse.Namespace, asha: bool = False) -> dict[str, float]:
    entries = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    reached = [e["time"] for e in entries if e["value"] >= args.target]
    return {"best": max(e["value"] for e in entries), "wall": max(e["time"] for e in entries) - start,
            "to_target": (min(reached) - start) if reached else float("nan"),
            "past_rung": _steps_past_rungs(run_dir, entries, args) if asha else float("nan")}


def _steps_past_rungs(run_dir: Path, entries: list[dict], args: argparse.Namespace) -> float:
    """ASHA's steps past a rung: the steps a trial began (and so spent from the budget) past the last
    rung it finished (:data:`ASHA_RUNGS`), mean over the trials that finished one and ended before the
    budget ran out. A trial stopped the moment its result at a rung is judged begins 0 steps past it;
    one stopped at its next poll has begun one or more, finished or cut short."""
    finished: dict[str, tuple[int, int]] = {}  # trial -> (its last finished step, the budget used by then)
    for e in entries:
        finished[e["trial"]] = max(finished.get(e["trial"], (0, 0)), (e["t"], e["used"]))
    began: dict[str, int] = {}
    for line in (run_dir / "began.jsonl").read_text().splitlines():
        e = json.loads(line)
        began[e["trial"]] = max(began.get(e["trial"], 0), e["t"])
    past = [began[trial] - max(r for r in ASHA_RUNGS if r <= t) for trial, (t, used) in finished.items()
            if used <= args.budget - 2 * args.concurrency and t >= ASHA_RUNGS[0]]
    return statistics.mean(past) if past else float("nan")


# -- trialflow ----------------------------------------------------------------------------------

TRIALFLOW_METHODS: dict[str, dict] = {
    "random": {"tuner": {"name": "Random"}},
    "tpe": {"tuner": {"name": "TPE", "classArgs": {"optimize_mode": "maximize"}}},
    "hyperband": {"advisor": {"name": "Hyperband", "classArgs": {"R": MAX_STEPS, "eta": 3,
                                                                 "optimize_mode": "maximize"}}},
    "bohb": {"advisor": {"name": "BOHB", "classArgs": {"min_budget": 1, "max_budget": MAX_STEPS, "eta": 3,
                                                       "optimize_mode": "maximize"}}},
    # beyond NNI: a promoted configuration goes on from its previous round's checkpoint, as Ray's do
    "hyperband+ckpt": {"advisor": {"name": "Hyperband", "classArgs": {
        "R": MAX_STEPS, "eta": 3, "optimize_mode": "maximize", "all_checkpoint_dir": "checkpoint"}}},
    "bohb+ckpt": {"advisor": {"name": "BOHB", "classArgs": {
        "min_budget": 1, "max_budget": MAX_STEPS, "eta": 3, "optimize_mode": "maximize",
        "all_checkpoint_dir": "checkpoint"}}},
    "tpe+asha": {"tuner": {"name": "TPE", "classArgs": {"optimize_mode": "maximize"}},
                 "assessor": {"name": "ASHA", "classArgs": {"optimize_mode": "maximize", "min_resource": ASHA_GRACE,
                                                            "reduction_factor": 3}}},
    "pbt": {"tuner": {"name": "PBTTuner", "classArgs": {"optimize_mode": "maximize", "population_size": 8}}},
}


def trialflow_run(method: str, root: Path, seed: int, args: argparse.Namespace) -> dict[str, float]:
    run_dir, code = _prepare(root, f"trialflow-{method}", seed, args)
    algo = json.loads(json.dumps(TRIALFLOW_METHODS[method]))
    for section in algo.values():
        if section["name"] != "ASHA":
            section.setdefault("classArgs", {})["seed"] = seed
    space = SPACE if method != "pbt" else {**SPACE, "PBT_STEPS": {"_type": "choice", "_value": [PBT_STEPS]}}
    config = {"searchSpace": space, "trialCommand": f"{sys.executable} trial.py", "trialCodeDirectory": str(code),
              "trialConcurrency": args.concurrency, "maxTrialNumber": 100000, "trainingService": {"platform": "local"},
              **algo}
    start = run_trialflow(config, run_dir, args.budget)
    return _outcome(run_dir, start, args, asha="asha" in method)


# -- NNI 3.0 ------------------------------------------------------------------------------------

def nni_run(method: str, root: Path, seed: int, args: argparse.Namespace) -> dict[str, float]:
    run_dir, code = _prepare(root, f"nni-{method}", seed, args)
    venv = args.nni_venv
    advisor = {k: v for k, v in TRIALFLOW_METHODS[method]["advisor"].items()}
    config = {"searchSpace": SPACE, "trialCommand": f"{venv / 'bin' / 'python'} trial.py",
              "trialCodeDirectory": str(code), "trialConcurrency": args.concurrency, "maxTrialNumber": 100000,
              "experimentWorkingDirectory": str(run_dir / "w"), "advisor": advisor,
              "trainingService": {"platform": "local"}}
    path = run_dir / "config.json"
    path.write_text(json.dumps(config))
    start = time.time()
    with nni_experiment(venv, path, run_dir / "home") as port:
        api = f"http://127.0.0.1:{port}/api/v1/nni"

        def over() -> bool:
            if any("Dispatcher exiting" in log.read_text() for log in (run_dir / "w").glob("*/log/dispatcher.log")):
                return True  # its tuner process is gone: NNI waits forever then
            with urllib.request.urlopen(f"{api}/check-status", timeout=20) as resp:
                return json.load(resp)["status"] in ("DONE", "ERROR", "STOPPED")

        def why() -> str:
            logs = sorted((run_dir / "w").glob("*/log/dispatcher.log"))
            errors = [line for log in logs for line in log.read_text().splitlines() if "Error" in line]
            return f"(its dispatcher: {errors[-1].strip()})" if errors else ""

        wait_spent(run_dir, args.budget, over, why)
    return _outcome(run_dir, start, args)


# -- Ray Tune -----------------------------------------------------------------------------------

def ray_run(method: str, root: Path, seed: int, args: argparse.Namespace) -> dict[str, float]:
    run_dir, code = _prepare(root, f"ray-{method}", seed, args)
    driver = run_dir / "driver.py"
    driver.write_text(RAY_DRIVER)
    start = time.time()
    done = subprocess.run([str(args.ray_venv / "bin" / "python"), str(driver), str(code), method,
                           str(args.concurrency)], capture_output=True, text=True, timeout=1800,
                          env={**os.environ, "RAY_AIR_NEW_OUTPUT": "0", "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1"})
    if done.returncode:
        raise RuntimeError(f"Ray Tune {method} failed:\n{done.stderr[-3000:]}")
    return _outcome(run_dir, start, args, asha=method == "asha")


def install_ray(venv: Path) -> None:
    create_venv(venv, "ray[tune]", "hpbandster", "ConfigSpace")


# -- the table ----------------------------------------------------------------------------------

COUNTERPART = {"trialflow-random": None, "trialflow-tpe": "trialflow-random", "trialflow-hyperband": "trialflow-random",
               "trialflow-bohb": "trialflow-random", "trialflow-tpe+asha": "trialflow-random",
               "trialflow-hyperband+ckpt": "trialflow-random", "trialflow-bohb+ckpt": "trialflow-random",
               "trialflow-pbt": "trialflow-random", "ray-asha": "trialflow-tpe+asha",
               "ray-hyperband": "trialflow-hyperband+ckpt", "ray-bohb": "trialflow-bohb+ckpt",
               "nni-hyperband": "trialflow-hyperband", "nni-bohb": "trialflow-bohb"}


def _median(results: list[dict[str, float]], key: str) -> float:
    values = [r[key] for r in results if r[key] == r[key]]  # NaN: target never reached
    return statistics.median(values) if values else float("nan")


def table(results: dict[str, list[dict[str, float]]]) -> list[list[object]]:
    rows: list[list[object]] = []
    for name, runs in results.items():
        if not runs:
            continue
        base = COUNTERPART.get(name)
        row: list[object] = [name, len(runs)]
        for key in ("best", "wall", "to_target", "past_rung"):
            value = _median(runs, key)
            reached = sum(1 for r in runs if r[key] == r[key])
            shown = {"best": f"{value:.4f}", "past_rung": f"{value:.2f}" if value == value else ""}.get(
                key, f"{value:.1f} s")
            if key == "to_target":
                shown += f" ({reached}/{len(runs)})"
            ratio = ""
            if base and base in results:
                other = _median(results[base], key)
                ratio = f"{value / other:.2f}x" if other == other and other else ""
            row += [shown, ratio]
        row.append(base or "")
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--budget", type=int, default=240, help="training steps in total per method and seed")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--step-seconds", type=float, default=0.05)
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--only", help="comma-separated method names (e.g. trialflow-bohb,ray-bohb)")
    parser.add_argument("--ray-venv", type=Path)
    parser.add_argument("--install-ray", action="store_true")
    parser.add_argument("--nni-venv", type=Path)
    parser.add_argument("--install-nni", action="store_true")
    args = parser.parse_args()
    use_own_home()
    set_process_defaults()  # as a trialflow command runs
    if args.install_ray and args.ray_venv and not (args.ray_venv / "bin" / "python").exists():
        install_ray(args.ray_venv)
    if args.install_nni and args.nni_venv and not (args.nni_venv / "bin" / "nnictl").exists():
        install_nni(args.nni_venv)
    runners: dict[str, Runner] = {
        f"trialflow-{m}": (lambda root, seed, a, m=m: trialflow_run(m, root, seed, a)) for m in TRIALFLOW_METHODS}
    if args.ray_venv:
        runners.update({f"ray-{m}": (lambda root, seed, a, m=m: ray_run(m, root, seed, a))
                        for m in ("asha", "hyperband", "bohb")})
    if args.nni_venv:
        runners.update({f"nni-{m}": (lambda root, seed, a, m=m: nni_run(m, root, seed, a))
                        for m in ("hyperband", "bohb")})
    if args.only:
        runners = {k: v for k, v in runners.items() if k in args.only.split(",")}
    results, failures = run_seeds(runners, args, "trialflow-mf-")
    print(textwrap.dedent(f"""
        budget {args.budget} steps of {args.step_seconds} s, concurrency {args.concurrency}, target {args.target},
        medians over {args.seeds} seeds (ratios: against the row named in the last column)"""))
    for name, reasons in failures.items():
        print(f"{name}: {len(reasons)} of {args.seeds} seeds failed; first: {reasons[0]}")
    print_table("multi-fidelity search at equal budget",
                ["method", "seeds", "best", "ratio", "wall", "ratio", "to target (reached)", "ratio",
                 "steps past rung", "ratio", "against"],
                table(results))


if __name__ == "__main__":
    main()
