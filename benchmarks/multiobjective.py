"""Multi-objective, constrained search at equal budget: trialflow's multi-objective TPE with and without
the MOASHA assessor beside Optuna 5's multi-objective TPE (``--optuna-venv``) and Syne Tune's MOASHA
(``--syne-venv``), each in its own virtualenv.

Two objectives, one constraint, fidelity = epochs: a network of ``width`` x ``depth`` (learning rate
``lr``, L2 ``alpha``, ``batch`` size) is trained for up to 27 epochs; the objectives are its accuracy
(maximize) and its size in thousands of parameters (minimize), the constraint its memory in kB (the
parameters and one batch's activations, 8 bytes each) at most ``MEMORY_BOUND_KB``. Workloads
(``--workload``):

- ``synthetic``: seeded; accuracy after ``t`` epochs is ``ceiling * (1 - exp(-speed * t))`` plus small
  noise, with a ceiling and speed set by the configuration; each epoch sleeps ``--step-seconds``;
- ``sklearn``: scikit-learn's ``MLPClassifier`` on the digits data set that ships with scikit-learn, one
  epoch a ``partial_fit`` pass, accuracy on a held-out quarter.

Every method draws epochs from one budget of ``--budget`` epochs in total (a locked counter file the
trials share, whatever runs them) at ``--concurrency`` trials at once; once it is spent the method is
stopped. Each epoch's result is logged: a model can be taken at any epoch, so every logged result
counts. Hypervolume: of the feasible logged results against the reference point (accuracy 0,
``REFERENCE_SIZE_K``), normalised by the reference box (1.0 would dominate all of it).

Per method, medians over ``--seeds`` seeds: the final hypervolume, the share of the budget spent when
the hypervolume first reached trialflow's full-budget TPE's median final one (``to TPE's``), and the
wall time from the method's own start (``trialflow create``, the driver's start) until the budget was
spent; with ratios against trialflow's TPE + MOASHA.

    python benchmarks/multiobjective.py [--workload synthetic|sklearn] [--seeds 5] [--budget 324]
        [--concurrency 4] [--optuna-venv DIR] [--syne-venv DIR] [--install] [--only a,b]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._budget import Runner, prepare, run_seeds, run_trialflow  # noqa: E402
from benchmarks._home import use_own_home  # noqa: E402
from benchmarks._stats import print_table  # noqa: E402
from benchmarks._venv import create_venv  # noqa: E402
from trialflow.server.api_choice import set_process_defaults  # noqa: E402
from trialflow.tuners.objectives import Objective, Objectives, hypervolume  # noqa: E402

MAX_EPOCHS = 27
MEMORY_BOUND_KB = 2000.0
REFERENCE_SIZE_K = 600.0  # beyond the largest network: 562k parameters
OBJECTIVES = Objectives((Objective("accuracy", True), Objective("size_k", False)))
SPACE = {"lr": {"_type": "loguniform", "_value": [1e-4, 1e-1]},
         "alpha": {"_type": "loguniform", "_value": [1e-6, 1e-2]},
         "width": {"_type": "choice", "_value": [16, 32, 64, 128, 256, 512]},
         "depth": {"_type": "choice", "_value": [1, 2, 3]},
         "batch": {"_type": "choice", "_value": [16, 64, 256]}}

# Standard library only at import (scikit-learn is imported by the sklearn workload when it trains):
# trialflow's trials import it, and Optuna's and Syne Tune's drivers in their own venvs.
WORKLOAD = '''
import fcntl, json, math, os, random, time

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = json.load(open(os.path.join(HERE, "mo_run.json")))
MAX_EPOCHS = RUN["max_epochs"]


def costs(p):
    """The size (thousands of parameters) and memory (kB) of a network on 64 inputs and 10 classes."""
    width, depth = int(p["width"]), int(p["depth"])
    params = 64 * width + width * width * (depth - 1) + 10 * width + width * depth + 10
    return params / 1000, (params + int(p["batch"]) * width * depth) * 8 / 1000


def _spend(result):
    """Take one epoch from the shared budget (False once it is spent); log the epoch's result."""
    with open(os.path.join(RUN["run_dir"], "budget.lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        counter = os.path.join(RUN["run_dir"], "steps")
        used = int(open(counter).read() or 0) if os.path.exists(counter) else 0
        if used >= RUN["budget"]:
            return False
        with open(counter + ".new", "w") as f:  # replaced whole: a trial killed mid-write never empties it
            f.write(str(used + 1))
        os.replace(counter + ".new", counter)
        with open(os.path.join(RUN["run_dir"], "log.jsonl"), "a") as f:
            f.write(json.dumps({"time": time.time(), "used": used + 1, **result}) + "\\n")
    return True


def _synthetic(p):
    ceiling = (0.99 - 0.3 / (1 + int(p["width"]) / 24) + 0.015 * (int(p["depth"]) - 1)
               - {16: 0.0, 64: 0.01, 256: 0.04}[int(p["batch"])]
               - 0.08 * (math.log10(p["lr"]) + 2.5) ** 2 - 0.01 * (math.log10(p["alpha"]) + 4) ** 2)
    speed = 0.04 + 0.3 * min(1.0, p["lr"] * 60) * (64 / int(p["batch"])) ** 0.25
    noise = random.Random(hash((RUN["seed"], round(p["lr"], 9), round(p["alpha"], 9), int(p["width"]),
                                int(p["depth"]), int(p["batch"]))))
    for t in range(1, MAX_EPOCHS + 1):
        time.sleep(RUN["step_seconds"])
        yield max(0.0, ceiling) * (1 - math.exp(-speed * t)) + noise.gauss(0, 0.003)


def _sklearn(p):
    import warnings
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from sklearn.neural_network import MLPClassifier

    x, y = load_digits(return_X_y=True)
    x = x / 16.0
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=RUN["seed"])
    model = MLPClassifier(hidden_layer_sizes=(int(p["width"]),) * int(p["depth"]), alpha=p["alpha"],
                          learning_rate_init=p["lr"], batch_size=int(p["batch"]), random_state=RUN["seed"])
    for _ in range(MAX_EPOCHS):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.partial_fit(x_train, y_train, classes=list(range(10)))
        yield float(model.score(x_test, y_test))


def epochs(p):
    """Train the configuration ``p``: each epoch's result (accuracy, size_k, memory_kb), until its last
    epoch or the shared budget is spent."""
    size_k, memory_kb = costs(p)
    for accuracy in (_synthetic if RUN["workload"] == "synthetic" else _sklearn)(p):
        result = {"accuracy": accuracy, "size_k": size_k, "memory_kb": memory_kb}
        if not _spend(result):
            return
        yield result
'''

NNI_TRIAL = '''
import nni
from workload import epochs
p = nni.get_next_parameter()
last = None
for result in epochs(p):
    last = {"default": result["accuracy"], **result}
    nni.report_intermediate_result(last)
if last is not None:
    nni.report_final_result(last)
'''

OPTUNA_DRIVER = '''
import json, os, sys, time
start = time.time()
import optuna
sys.path.insert(0, sys.argv[1])
from workload import RUN, epochs

optuna.logging.set_verbosity(optuna.logging.WARNING)
concurrency, bound = int(sys.argv[2]), float(sys.argv[3])


def objective(trial):
    p = {"lr": trial.suggest_float("lr", 1e-4, 1e-1, log=True),
         "alpha": trial.suggest_float("alpha", 1e-6, 1e-2, log=True),
         "width": trial.suggest_categorical("width", [16, 32, 64, 128, 256, 512]),
         "depth": trial.suggest_categorical("depth", [1, 2, 3]),
         "batch": trial.suggest_categorical("batch", [16, 64, 256])}
    last = None
    for last in epochs(p):
        pass
    if last is None:
        raise optuna.TrialPruned()  # the budget was spent before its first epoch
    trial.set_user_attr("constraint", [last["memory_kb"] - bound])
    return last["accuracy"], last["size_k"]


def spent(study, trial):
    path = os.path.join(RUN["run_dir"], "steps")
    if os.path.exists(path) and int(open(path).read() or 0) >= RUN["budget"]:
        study.stop()


sampler = optuna.samplers.TPESampler(seed=RUN["seed"], constraints_func=lambda t: t.user_attrs["constraint"])
study = optuna.create_study(directions=["maximize", "minimize"], sampler=sampler)
study.optimize(objective, n_jobs=concurrency, callbacks=[spent])
print(json.dumps({"start": start}))
'''

SYNE_TRIAL = '''
import argparse, sys, os
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from syne_tune import Reporter
from workload import epochs
parser = argparse.ArgumentParser()
for name in ("lr", "alpha"):
    parser.add_argument(f"--{name}", type=float)
for name in ("width", "depth", "batch"):
    parser.add_argument(f"--{name}", type=int)
args, _ = parser.parse_known_args()
report = Reporter()
for epoch, result in enumerate(epochs(vars(args)), start=1):
    # Syne Tune's MOASHA minimizes every metric; it has no constraints
    report(epoch=epoch, neg_accuracy=-result["accuracy"], size_k=result["size_k"])
'''

SYNE_DRIVER = '''
import json, os, sys, time
start = time.time()
from syne_tune import Tuner
from syne_tune.backend import LocalBackend
from syne_tune.config_space import choice, loguniform
from syne_tune.optimizer.schedulers.multiobjective.moasha import MOASHA
sys.path.insert(0, sys.argv[1])
from workload import MAX_EPOCHS, RUN

concurrency = int(sys.argv[2])
space = {"lr": loguniform(1e-4, 1e-1), "alpha": loguniform(1e-6, 1e-2), "width": choice([16, 32, 64, 128, 256, 512]),
         "depth": choice([1, 2, 3]), "batch": choice([16, 64, 256])}
scheduler = MOASHA(space, metrics=["neg_accuracy", "size_k"], do_minimize=True, time_attr="epoch", max_t=MAX_EPOCHS,
                   grace_period=1, reduction_factor=3, random_seed=RUN["seed"])


def spent(status):
    path = os.path.join(RUN["run_dir"], "steps")
    return os.path.exists(path) and int(open(path).read() or 0) >= RUN["budget"]


tuner = Tuner(trial_backend=LocalBackend(entry_point=os.path.join(sys.argv[1], "syne_trial.py")), scheduler=scheduler,
              stop_criterion=spent, n_workers=concurrency, sleep_time=0.2, print_update_interval=3600,
              save_tuner=False, tuner_name=f"mo-{RUN['seed']}")
tuner.run()
print(json.dumps({"start": start}))
'''


def _prepare(root: Path, name: str, seed: int, args: argparse.Namespace) -> tuple[Path, Path]:
    return prepare(root, name, seed, {"workload.py": WORKLOAD, "trial.py": NNI_TRIAL, "syne_trial.py": SYNE_TRIAL},
                   "mo_run.json", {"budget": args.budget, "seed": seed, "step_seconds": args.step_seconds,
                                   "max_epochs": MAX_EPOCHS, "workload": args.workload})


def _volume(entries: list[dict]) -> float:
    points = [(e["accuracy"], e["size_k"]) for e in entries if e["memory_kb"] <= MEMORY_BOUND_KB]
    return hypervolume(OBJECTIVES, points, (0.0, REFERENCE_SIZE_K)) / REFERENCE_SIZE_K


def _outcome(run_dir: Path, start: float) -> dict:
    """The final hypervolume, the wall time, and the hypervolume after each epoch of the budget."""
    entries = sorted((json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()),
                     key=lambda e: e["used"])
    curve = [_volume(entries[:i + 1]) for i in range(len(entries))]  # small budgets: quadratic is fine
    return {"volume": curve[-1] if curve else 0.0, "wall": max(e["time"] for e in entries) - start,
            "curve": curve}


# -- trialflow ----------------------------------------------------------------------------------

MOASHA = {"name": "MOASHA", "classArgs": {"min_resource": 1, "reduction_factor": 3, "max_resource": MAX_EPOCHS}}
TRIALFLOW_METHODS: dict[str, dict] = {
    "tpe": {"tuner": {"name": "TPE"}},
    "tpe+moasha": {"tuner": {"name": "TPE"}, "assessor": MOASHA},
    "random+moasha": {"tuner": {"name": "Random"}, "assessor": MOASHA},
}


def trialflow_run(method: str, root: Path, seed: int, args: argparse.Namespace) -> dict:
    run_dir, code = _prepare(root, f"trialflow-{method}", seed, args)
    algo = json.loads(json.dumps(TRIALFLOW_METHODS[method]))
    algo["tuner"].setdefault("classArgs", {})["seed"] = seed
    config = {"searchSpace": SPACE, "trialCommand": f"{sys.executable} trial.py", "trialCodeDirectory": str(code),
              "trialConcurrency": args.concurrency, "maxTrialNumber": 100000, "trainingService": {"platform": "local"},
              "objectives": [{"name": o.name, "direction": "maximize" if o.maximize else "minimize"}
                             for o in OBJECTIVES.objectives],
              "constraints": [{"name": "memory_kb", "max": MEMORY_BOUND_KB}], **algo}
    start = run_trialflow(config, run_dir, args.budget)
    return _outcome(run_dir, start)


# -- Optuna and Syne Tune, each in its own venv ------------------------------------------------

def _driven(name: str, driver: str, python: Path, root: Path, seed: int, args: argparse.Namespace,
            *extra: str) -> dict:
    run_dir, code = _prepare(root, name, seed, args)
    path = run_dir / "driver.py"
    path.write_text(driver)
    start = time.time()
    done = subprocess.run([str(python), str(path), str(code), str(args.concurrency), *extra], capture_output=True,
                          text=True, timeout=1800, cwd=run_dir)
    if done.returncode:
        raise RuntimeError(f"{name} failed:\n{done.stderr[-3000:]}")
    return _outcome(run_dir, start)


def optuna_run(root: Path, seed: int, args: argparse.Namespace) -> dict:
    return _driven("optuna-tpe", OPTUNA_DRIVER, args.optuna_venv / "bin" / "python", root, seed, args,
                   str(MEMORY_BOUND_KB))


def syne_run(root: Path, seed: int, args: argparse.Namespace) -> dict:
    return _driven("syne-moasha", SYNE_DRIVER, args.syne_venv / "bin" / "python", root, seed, args)


def install(args: argparse.Namespace) -> None:
    """The venvs named and missing: Optuna 5 with scikit-learn; Syne Tune with what its MOASHA and local
    backend import (its xgboost dependency is for searchers not used here)."""
    if args.optuna_venv and not (args.optuna_venv / "bin" / "python").exists():
        create_venv(args.optuna_venv, "optuna>=5,<6", "scikit-learn")
    if args.syne_venv and not (args.syne_venv / "bin" / "python").exists():
        create_venv(args.syne_venv, "numpy<3", "dill", "pandas", "typing_extensions", "sortedcontainers",
                    "statsmodels", "scikit-learn", "tqdm", "psutil")
        subprocess.run([str(args.syne_venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps",
                        "syne-tune==0.16.0"], check=True)


# -- the table ----------------------------------------------------------------------------------

BASE = "trialflow-tpe+moasha"


def _median(values: list[float]) -> float:
    kept = [v for v in values if v == v]  # NaN: never reached
    return statistics.median(kept) if kept else float("nan")


def table(results: dict[str, list[dict]], budget: int) -> list[list[object]]:
    full = _median([r["volume"] for r in results.get("trialflow-tpe", [])])
    rows: list[list[object]] = []
    for name, runs in results.items():
        volume, wall = _median([r["volume"] for r in runs]), _median([r["wall"] for r in runs])
        reached = [next((i + 1 for i, v in enumerate(r["curve"]) if v >= full), float("nan")) / budget
                   for r in runs]
        share = _median(reached)
        rows.append([name, len(runs), f"{volume:.4f}", _ratio(results, name, volume, "volume"),
                     f"{share:.0%} ({sum(v == v for v in reached)}/{len(runs)})", f"{wall:.1f} s",
                     _ratio(results, name, wall, "wall")])
    return rows


def _ratio(results: dict[str, list[dict]], name: str, mine: float, key: str) -> str:
    """``mine`` against the median of ``key`` in the :data:`BASE` method's runs ("" for that row itself)."""
    if name == BASE or not results.get(BASE):
        return ""
    return f"{mine / _median([r[key] for r in results[BASE]]):.2f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("synthetic", "sklearn"), default="synthetic")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--budget", type=int, default=12 * MAX_EPOCHS, help="epochs in total per method and seed")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--step-seconds", type=float, default=0.05, help="an epoch's sleep (synthetic)")
    parser.add_argument("--only", help="comma-separated method names (e.g. trialflow-tpe+moasha,syne-moasha)")
    parser.add_argument("--optuna-venv", type=Path)
    parser.add_argument("--syne-venv", type=Path)
    parser.add_argument("--install", action="store_true", help="create the named venvs that are missing")
    args = parser.parse_args()
    use_own_home()
    set_process_defaults()  # as a trialflow command runs
    if args.install:
        install(args)
    runners: dict[str, Runner] = {
        f"trialflow-{m}": (lambda root, seed, a, m=m: trialflow_run(m, root, seed, a)) for m in TRIALFLOW_METHODS}
    if args.optuna_venv:
        runners["optuna-tpe"] = optuna_run
    if args.syne_venv:
        runners["syne-moasha"] = syne_run
    if args.only:
        runners = {k: v for k, v in runners.items() if k in args.only.split(",")}
    results, failures = run_seeds(runners, args, "trialflow-mo-", failing=(RuntimeError,))  # Stalled is one
    print(textwrap.dedent(f"""
        {args.workload}: budget {args.budget} epochs (at most {MAX_EPOCHS} a trial), concurrency {args.concurrency},
        memory <= {MEMORY_BOUND_KB:g} kB; medians over {args.seeds} seeds; ratios against {BASE}"""))
    for name, reasons in failures.items():
        print(f"{name}: {len(reasons)} of {args.seeds} seeds failed; first: {reasons[0]}")
    print_table("multi-objective search at equal budget",
                ["method", "seeds", "hypervolume", "ratio", "budget to TPE's (reached)", "wall", "ratio"],
                table({k: v for k, v in results.items() if v}, args.budget))


if __name__ == "__main__":
    main()
