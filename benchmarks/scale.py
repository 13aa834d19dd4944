"""Scale run: Ray Tune's bookkeeping release test on this machine.

N trials (default 10,000) of a Python trial that sleeps 1 s and reports one final metric, at
concurrency C (default 16) on the local service with the Random tuner; ideal = ceil(N/C) x 1 s
(625 s for the defaults; Ray's bar is < 800 s = 1.28x on 16 CPUs; ours is 1.15x on 2). Prints:

* total wall time (first submit -> last end) against the ideal;
* the controller's peak RSS (target <= 300 MB), and the kept Prefect server's beside it;
* where the CPU went, per trial: the controller, the Prefect server, and the rest of the machine
  (the trials' own processes: interpreter start, the keeper, the work);
* per-trial bookkeeping around trials 1k / 5k / 10k (medians over a window of trials): launch
  (trial submitted -> its command started), collect (command exited -> end recorded), and the
  loop's turnaround (an end recorded -> the next trial submitted) -- flat means no O(n) per trial;
  beside them the trial's own time beyond its sleep (command started -> exited, less ``--sleep``:
  the interpreter's start-up, ``import nni``, reporting, exit);
* TPE's suggestion time with the same numbers of finished trials (tuner_latency's measure);
* the time to render ``trialflow trial ls`` and ``trialflow experiment export`` for the whole
  experiment, beside ``trialflow --help`` (the CLI's start-up alone).

The controller runs in its own process (``--controller``), so its peak RSS is its own.

    python benchmarks/scale.py [--trials 10000] [--concurrency 16] [--sleep 1.0] [--venv DIR]

Every trial is a Python process, so what this Python's ``site`` imports at start-up counts per trial
(reported: ``python -c pass``). ``--venv DIR`` runs the benchmark in a clean virtualenv holding this
checkout (created when missing), as a user's ``pip install`` would have it; see ``benchmarks/_venv.py``.

``SCALE_SERVER=temporary`` runs it on Prefect's temporary server instead of the kept one (its CPU then
counts in "the rest").

``--ray-venv DIR`` (``--install-ray`` creates it: ``pip install "ray[tune]"``) runs Ray Tune's own version of the
test beside it, on the same cores and in the same run: a function trainable that sleeps as the trial does and
reports one result, N samples at ``max_concurrent_trials`` C (Ray started with C logical CPUs, so that C run at
once on any machine), actors reused and state saved every 100 s as Ray's release test has them, timed around
``Tuner.fit()``; both ratios to the ideal are printed, with the CPU each
spent per trial (the whole machine's busy time during the run, over N).

``--mlflow`` / ``--wandb`` run it twice, without and with a tracker (a local ``mlflow server``; W&B
offline runs), and print what tracking costs: both walls, the controller's CPU per trial, the tracking
worker's (W&B's service included), and the tracker's client alone logging made-up trials in this
process, each against the loop's (the controller's CPU per trial without tracking).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._stats import print_table, summary_row  # noqa: E402
from benchmarks._venv import add_venv_option, create_venv, interpreter_start_ms, rerun_in  # noqa: E402
from trialflow.server.api_choice import set_process_defaults  # noqa: E402

TRIAL = "import time, nni\nnni.get_next_parameter()\ntime.sleep({sleep})\nnni.report_final_result(1.0)\n"
WINDOW = 200  # trials per bookkeeping point
# Ray Tune's version of the test, run by the Ray venv's Python: argv n, concurrency, sleep, storage folder. As
# Ray's release test sets it up: actors reused between trials (its timed_tune_run), the experiment's state
# saved every 100 s (its environment). With Ray's defaults instead (a new actor per trial, state saved as
# Ray decides), 2,000 trials took 13.35x ideal on the 2-core VM (benchmarks/README.md).
RAY_RELEASE_SETTINGS = {"TUNE_GLOBAL_CHECKPOINT_S": "100"}
RAY_TEST = """
import json, sys, time
import ray
from ray import tune
n, concurrency, sleep, storage = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
ray.init(num_cpus=concurrency, include_dashboard=False, log_to_driver=False, configure_logging=False)
def trainable(config):
    time.sleep(sleep)
    tune.report({"score": 1.0})
tuner = tune.Tuner(trainable, param_space={"x": tune.uniform(0, 1)},
                   tune_config=tune.TuneConfig(num_samples=n, max_concurrent_trials=concurrency, reuse_actors=True),
                   run_config=tune.RunConfig(storage_path=storage, verbose=0))
start = time.perf_counter()
results = tuner.fit()
wall = time.perf_counter() - start
print(json.dumps({"wall": wall, "succeeded": sum(r.error is None for r in results)}))
"""


def controller(config_path: str) -> None:
    """Run the experiment in this process; print its id, status, peak RSS and CPU seconds as JSON."""
    from trialflow import run_experiment

    result = run_experiment(config_path)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"experiment_id": result.experiment_id, "status": result.status,
                      "succeeded": sum(t.status == "SUCCEEDED" for t in result.trials),
                      "controller_kb": usage.ru_maxrss, "controller_cpu": usage.ru_utime + usage.ru_stime}))


def _stat_fields(pid: int) -> list[str]:
    """A process's /proc/<pid>/stat fields after its name (state, ppid, pgrp, session, ...)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _cpu_seconds(pid: int) -> float:
    """A process's CPU seconds, its reaped children's included (/proc/<pid>/stat)."""
    return sum(int(f) for f in _stat_fields(pid)[11:15]) / os.sysconf("SC_CLK_TCK")


def _processes() -> dict[int, list[str]]:
    """Every process's stat fields by pid (those gone while read are left out)."""
    found = {}
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit():
                found[int(proc.name)] = _stat_fields(int(proc.name))
        except (OSError, IndexError):
            continue
    return found


def _total_cpu_seconds(pids: Iterable[int]) -> float:
    """The CPU seconds of ``pids`` (those gone meanwhile count nothing)."""
    total = 0.0
    for pid in pids:
        try:
            total += _cpu_seconds(pid)
        except (OSError, IndexError):
            continue
    return total


def _session_cpu_seconds(session: int) -> float:
    """The CPU seconds of every process in the session ``session`` (a server and its workers)."""
    return _total_cpu_seconds(pid for pid, fields in _processes().items() if int(fields[3]) == session)


def _tree_cpu_seconds(pid: int) -> float:
    """The CPU seconds of ``pid`` and every process below it (W&B's service runs in a session of its own)."""
    parents = {p: int(fields[1]) for p, fields in _processes().items()}
    tree = {pid}
    while grown := {p for p, parent in parents.items() if parent in tree} - tree:
        tree |= grown
    return _total_cpu_seconds(tree)


def _running(marker: bytes) -> list[int]:
    """The processes whose command line holds ``marker``."""
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and marker in _read(p / "cmdline")]


def _machine_busy_seconds() -> float:
    """CPU seconds all cores spent busy since boot (/proc/stat: all but idle and iowait)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


def _vm_hwm_kb(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def trial_timings(exp_dir: Path, store) -> list[dict[str, float]]:  # type: ignore[no-untyped-def]
    """Per trial, in submission order: submit, started, exited (keeper files), recorded (store)."""
    rows = []
    for trial in store.trials():
        meta = exp_dir / "trials" / trial.id / ".nni"
        try:
            started = json.loads((meta / "started").read_text())["time"]
            exited = json.loads((meta / "state").read_text())["end_time"]
        except (OSError, ValueError, KeyError):
            continue
        rows.append({"sequence": trial.sequence, "submit": trial.submit_time, "started": started,
                     "exited": exited, "recorded": trial.end_time or exited})
    return sorted(rows, key=lambda r: r["sequence"])


def bookkeeping(rows: list[dict[str, float]], concurrency: int, point: int,
                sleep: float) -> tuple[float, float, float, float]:
    """Median ms of (launch, collect, turnaround, the trial beyond its sleep) over the ``WINDOW``
    trials before ``point``."""
    lo, hi = max(0, point - WINDOW), min(point, len(rows))
    window = rows[lo:hi]
    ends = sorted(r["recorded"] for r in rows)
    submits = sorted(r["submit"] for r in rows)
    # the k-th end frees the slot that the (k + C)-th submission takes
    turnaround = [submits[k + concurrency] - ends[k] for k in range(max(0, lo - concurrency), hi - concurrency)
                  if k + concurrency < len(submits)]
    return (1000 * statistics.median(r["started"] - r["submit"] for r in window),
            1000 * statistics.median(r["recorded"] - r["exited"] for r in window),
            1000 * statistics.median(turnaround) if turnaround else float("nan"),
            1000 * statistics.median(r["exited"] - r["started"] - sleep for r in window))


def _cli_seconds(*args: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "trialflow.cli", *args], check=True, capture_output=True, timeout=600)
    return time.perf_counter() - start


def tpe_suggestion_ms(points: list[int]) -> list[float]:
    from benchmarks.tuner_latency import _history, measure

    with tempfile.TemporaryDirectory() as workdir:
        return [measure("TPE", _history(n, random.Random(n)), 15, workdir)[1] for n in points]


class _WorkerCpu(threading.Thread):
    """The CPU seconds of the experiment's tracking worker and its children, sampled until the experiment ends."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.seconds = 0.0
        self.done = threading.Event()

    def run(self) -> None:
        pid = None
        while not self.done.wait(0.2):
            if pid is None:
                pid = next(iter(_running(b"trialflow.tracking.worker")), None)
            if pid is not None:
                if not Path(f"/proc/{pid}").exists():
                    pid = None  # ended (its last samples counted)
                    continue
                self.seconds = max(self.seconds, _tree_cpu_seconds(pid))


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def run(trials: int, concurrency: int, sleep: float, tpe: bool = True, tracking: dict | None = None) -> dict:
    """Run the scale experiment (logged to the trackers of ``tracking``, a config section, when given);
    returns the measured figures (see the module doc)."""
    from trialflow.experiments import open_store

    ideal = math.ceil(trials / concurrency) * sleep
    with tempfile.TemporaryDirectory() as tmp:
        code = Path(tmp) / "code"
        code.mkdir()
        (code / "trial.py").write_text(TRIAL.format(sleep=sleep))
        work = Path(tmp) / "w"
        config = {"experimentName": "scale", "searchSpace": {"x": {"_type": "uniform", "_value": [0, 1]}},
                  "trialCommand": f"{sys.executable} trial.py", "trialCodeDirectory": str(code),
                  "trialConcurrency": concurrency, "maxTrialNumber": trials,
                  "experimentWorkingDirectory": str(work), "tuner": {"name": "Random", "classArgs": {"seed": 0}},
                  "trainingService": {"platform": "local"}}
        if tracking:
            config["tracking"] = tracking
        config_path = Path(tmp) / "config.json"
        config_path.write_text(json.dumps(config))
        from trialflow.server.kept_server import ensure_server, stop_server

        home = Path(tmp) / "home"
        server = ensure_server(home)  # trialflow's kept server, started before the clock runs
        env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
        env.update(PREFECT_LOGGING_LEVEL=os.environ.get("PREFECT_LOGGING_LEVEL", "WARNING"),
                   TRIALFLOW_HOME=str(home), TRIALFLOW_PREFECT_SERVER=os.environ.get("SCALE_SERVER", "kept"))
        # the server's session: its port keeper and the process serving the app
        server_cpu, busy = _session_cpu_seconds(server.pid), _machine_busy_seconds()
        worker = _WorkerCpu()
        worker.start()
        try:
            started = time.perf_counter()
            out = subprocess.run([sys.executable, __file__, "--controller", str(config_path)], env=env, check=True,
                                 stdout=subprocess.PIPE, text=True).stdout
            controller_wall = time.perf_counter() - started
            server_cpu, busy = _session_cpu_seconds(server.pid) - server_cpu, _machine_busy_seconds() - busy
            server_kb = max((_vm_hwm_kb(pid) or 0 for pid, fields in _processes().items()
                             if int(fields[3]) == server.pid), default=0) or None
        finally:
            worker.done.set()
            stop_server(home)
        summary = json.loads(out.strip().splitlines()[-1])
        exp_id = summary["experiment_id"]
        store = open_store(work, exp_id)
        rows = trial_timings(work / exp_id, store)
        store.close()
        wall = max(r["recorded"] for r in rows) - min(r["submit"] for r in rows)
        points = sorted({p for p in (trials // 4, 1000, 5000, 10000, trials) if WINDOW <= p <= trials})
        books = {p: bookkeeping(rows, concurrency, p, sleep) for p in points}
        cli_start = _cli_seconds("--help")
        ls = _cli_seconds("trial", "ls", exp_id, "--root", str(work))
        export = _cli_seconds("experiment", "export", exp_id, "--root", str(work), "-t", "csv", "-f",
                              str(Path(tmp) / "export.csv"))
    return {"trials": trials, "concurrency": concurrency, "sleep": sleep, "ideal": ideal, "wall": wall,
            "status": summary["status"], "succeeded": summary["succeeded"],
            "controller_mb": summary["controller_kb"] / 1024,
            "server_mb": (server_kb or 0) / 1024, "bookkeeping": books,
            "tracking_worker_ms_per_trial": 1000 * worker.seconds / trials, "controller_wall": controller_wall,
            "cpu_ms_per_trial": {"controller": 1000 * summary["controller_cpu"] / trials,
                                 "Prefect server": 1000 * server_cpu / trials,
                                 "trials and the rest":
                                     1000 * (busy - summary["controller_cpu"] - server_cpu) / trials},
            "tpe_ms": dict(zip(points, tpe_suggestion_ms(points), strict=True)) if tpe else {},
            "cli_start": cli_start, "trial_ls": ls, "export": export, "python_start_ms": interpreter_start_ms()}


def ray_run(venv: Path, trials: int, concurrency: int, sleep: float) -> dict:
    """Ray Tune's version of the test in ``venv`` (see the module doc): its wall time around ``fit()``, the
    trials that succeeded and the machine's CPU per trial while it ran."""
    with tempfile.TemporaryDirectory() as tmp:
        busy = _machine_busy_seconds()
        done = subprocess.run([str(venv / "bin" / "python"), "-c", RAY_TEST, str(trials), str(concurrency), str(sleep),
                               str(Path(tmp) / "ray_results")], check=True, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **RAY_RELEASE_SETTINGS})
        busy = _machine_busy_seconds() - busy
    out = json.loads(done.stdout.strip().splitlines()[-1])
    return {**out, "ideal": math.ceil(trials / concurrency) * sleep, "cpu_ms_per_trial": 1000 * busy / trials}


def report(r: dict) -> None:
    print_table(f"{r['trials']} trials x {r['sleep']:g} s at concurrency {r['concurrency']}, Random tuner, local "
                f"service: {r['status']}, {r['succeeded']} succeeded",
                ["measure", "value", "target"],
                [["wall (first submit -> last end)", f"{r['wall']:.1f} s = {r['wall'] / r['ideal']:.2f}x ideal "
                  f"({r['ideal']:.0f} s)", "<= 1.15x"],
                 ["controller peak RSS", f"{r['controller_mb']:.0f} MB", "<= 300 MB"],
                 ["kept Prefect server peak RSS", f"{r['server_mb']:.0f} MB", "-"],
                 *[[f"CPU per trial: {where}", f"{ms:.1f} ms", "-"] for where, ms in r["cpu_ms_per_trial"].items()],
                 ["this Python's start-up (python -c pass), CPU", f"{r['python_start_ms']:.0f} ms", "-"],
                 ["trialflow --help (CLI start-up)", f"{r['cli_start']:.2f} s", "-"],
                 ["trialflow trial ls", f"{r['trial_ls']:.2f} s", "-"],
                 ["trialflow experiment export (csv)", f"{r['export']:.2f} s", "-"]])
    print()
    print_table("per-trial bookkeeping, median ms over the 200 trials before each point",
                ["trials", "launch", "collect", "turnaround", "in the trial beyond its sleep",
                 "TPE suggest+store+observe"],
                [[p, f"{a:.1f}", f"{b:.1f}", f"{c:.1f}", f"{d:.1f}", f"{r['tpe_ms'].get(p, float('nan')):.1f}"]
                 for p, (a, b, c, d) in r["bookkeeping"].items()])


def summary(profile: str) -> list[list[object]]:
    """Rows for ``python -m benchmarks`` (short: 800 trials; full: 10,000)."""
    trials = 800 if profile == "short" else 10000
    r = run(trials, 16, 1.0, tpe=False)
    name = f"scale ({trials:,} x 1 s, C=16)"
    first, last = min(r["bookkeeping"]), max(r["bookkeeping"])
    book = [sum(r["bookkeeping"][p][:3]) for p in (first, last)]
    return [summary_row(name, "wall, first submit -> last end", r["wall"], "s", "ideal", r["ideal"], 1.15),
            summary_row(name, "controller peak RSS", r["controller_mb"], "MB", "300 MB budget", 300.0, 1.0),
            *[summary_row(name, f"CPU per trial: {where}", ms, "ms", "-", None)
              for where, ms in r["cpu_ms_per_trial"].items()],
            summary_row(name, f"bookkeeping per trial at {last:,}", book[1], "ms", f"same at {first:,}", book[0]),
            summary_row(name, "trialflow trial ls", r["trial_ls"], "s", "CLI start-up (--help)", r["cli_start"]),
            summary_row(name, "trialflow experiment export", r["export"], "s", "CLI start-up (--help)",
                        r["cli_start"]),
            summary_row(name, "this Python's start-up, CPU", r["python_start_ms"], "ms", "-", None)]


def _client_cpu_ms(tracker: str, settings: dict, runs: int = 200) -> float:
    """CPU ms per trial of the tracker's client alone (this process, W&B's service included): the
    tracking worker's runs class logging made-up ended trials like the scale trial (one final result,
    two small log files), with no store and no controller."""
    from trialflow.records.store import ExperimentRecord, Metric, TrialRecord
    from trialflow.tracking.worker import open_runs

    experiment_id = f"client{int(time.time()) % 10**6}"
    now = time.time()
    record = ExperimentRecord(experiment_id, "scale", {}, None, "RUNNING", None, now, None, None, 0)
    logger = open_runs({"tracker": tracker, "experiment_id": experiment_id, "settings": settings})
    logger.connect(record, {}, "local", "Random")
    logs = {"trial.stdout": "out\n", "trial.stderr": "err\n"}

    def log(i: int) -> None:
        trial = TrialRecord(f"t{i}", i, i, {"x": random.random()}, {}, "SUCCEEDED", None, 0, None, None, now, now,
                            now + 1, 0.5)
        logger.log_trial(trial, [Metric(trial.id, "FINAL", 0, 0.5, now + 1)], logs)

    for i in range(20):  # warm: imports, connections, W&B's service
        log(i)
    def cpu() -> float:  # this process and W&B's service (the MLflow server, a child too, is not the client)
        return _cpu_seconds(os.getpid()) + sum(_tree_cpu_seconds(pid) for pid in _running(b"wandb-core"))

    before = cpu()
    for i in range(20, 20 + runs):
        log(i)
    spent = cpu() - before
    logger.close()
    return 1000 * spent / runs


def tracking_cost(trials: int, concurrency: int, sleep: float, tracker: str) -> None:
    """The same experiment without and with a tracker, one run after the other: ``mlflow`` (``mlflow
    server`` on loopback) or ``wandb`` (offline runs): the tracking worker's CPU per trial (W&B's service
    included) against the controller's, and both walls."""
    from trialflow.testing.mlflow_server import LocalMlflow

    mlflow = LocalMlflow(auth=False).start() if tracker == "mlflow" else None
    try:
        bare = run(trials, concurrency, sleep, tpe=False)
        server_cpu = _session_cpu_seconds(mlflow.proc.pid) if mlflow else 0.0  # type: ignore[union-attr]
        section = ({"mlflow": {"trackingUri": mlflow.uri, "experimentName": f"scale-{time.time():.0f}"}} if mlflow
                   else {"wandb": {"project": "scale"}})
        logged = run(trials, concurrency, sleep, tpe=False, tracking=section)
        if mlflow:
            server_cpu = _session_cpu_seconds(mlflow.proc.pid) - server_cpu  # type: ignore[union-attr]
        with tempfile.TemporaryDirectory() as folder:
            client = _client_cpu_ms(tracker, {"tracking_uri": mlflow.uri, "mlflow_experiment": "client"} if mlflow
                                    else {"folder": folder, "project": "client", "mode": "offline", "entity": None})
    finally:
        if mlflow:
            mlflow.close()
    loop = bare["cpu_ms_per_trial"]["controller"]
    worker = logged["tracking_worker_ms_per_trial"]
    name = "MLflow" if mlflow else "W&B (offline)"
    print_table(f"{trials} trials x {sleep:g} s at concurrency {concurrency}, without and with {name} tracking",
                ["measure", "without", f"with {name}", "ratio / share"],
                [["wall (first submit -> last end)", f"{bare['wall']:.1f} s", f"{logged['wall']:.1f} s",
                  f"{logged['wall'] / bare['wall']:.3f}x"],
                 ["controller process, start to exit (with logging's end)", f"{bare['controller_wall']:.1f} s",
                  f"{logged['controller_wall']:.1f} s", f"{logged['controller_wall'] / bare['controller_wall']:.3f}x"],
                 ["controller CPU per trial", f"{loop:.1f} ms", f"{logged['cpu_ms_per_trial']['controller']:.1f} ms",
                  f"{logged['cpu_ms_per_trial']['controller'] / loop:.3f}x"],
                 ["tracking worker CPU per trial", "-", f"{worker:.1f} ms",
                  f"{100 * worker / loop:.1f} % of the loop's"],
                 [f"{name}'s client alone, CPU per trial logged", "-", f"{client:.1f} ms",
                  f"{100 * client / loop:.1f} % of the loop's"],
                 *([["MLflow server CPU per trial", "-", f"{1000 * server_cpu / trials:.1f} ms", "-"]] if mlflow
                   else []),
                 *[[f"CPU per trial: {where}", f"{ms:.1f} ms", f"{logged['cpu_ms_per_trial'][where]:.1f} ms",
                    f"{logged['cpu_ms_per_trial'][where] / ms:.3f}x"]
                   for where, ms in bare["cpu_ms_per_trial"].items() if where != "controller"],
                 *[[f"median ms per trial at {point:,}: {what}", f"{a:.1f}", f"{b:.1f}", f"{b / a:.3f}x" if a else "-"]
                   for point in bare["bookkeeping"]
                   for what, a, b in zip(("launch", "collect", "turnaround", "in the trial beyond its sleep"),
                                         bare["bookkeeping"][point], logged["bookkeeping"][point], strict=True)]])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--sleep", type=float, default=1.0)
    parser.add_argument("--json", help="also write the measured figures to this file")
    parser.add_argument("--mlflow", action="store_true",
                        help="run it twice, without and with logging to a local MLflow server, and print the cost")
    parser.add_argument("--wandb", action="store_true",
                        help="run it twice, without and with logging W&B offline runs, and print the cost")
    parser.add_argument("--ray-venv", type=Path, help="also run Ray Tune's version of the test from this virtualenv")
    parser.add_argument("--install-ray", action="store_true", help="create --ray-venv with ray[tune] first")
    add_venv_option(parser)
    parser.add_argument("--controller", help=argparse.SUPPRESS)
    args = parser.parse_args()
    rerun_in(args.venv)
    set_process_defaults()  # as a trialflow command runs
    if args.controller:
        controller(args.controller)
        return
    if args.mlflow or args.wandb:
        tracking_cost(args.trials, args.concurrency, args.sleep, "mlflow" if args.mlflow else "wandb")
        return
    if args.install_ray and args.ray_venv and not (args.ray_venv / "bin" / "python").exists():
        create_venv(args.ray_venv, "ray[tune]")
    result = run(args.trials, args.concurrency, args.sleep)
    report(result)
    if args.ray_venv:
        ray = result["ray"] = ray_run(args.ray_venv, args.trials, args.concurrency, args.sleep)
        print()
        print_table(f"the same {args.trials} trials x {args.sleep:g} s at concurrency {args.concurrency}, same run",
                    ["", "wall", "vs ideal", "CPU per trial (machine)", "succeeded"],
                    [["trialflow (first submit -> last end)", f"{result['wall']:.1f} s",
                      f"{result['wall'] / result['ideal']:.2f}x", f"{sum(result['cpu_ms_per_trial'].values()):.1f} ms",
                      result["succeeded"]],
                     ["Ray Tune (Tuner.fit)", f"{ray['wall']:.1f} s", f"{ray['wall'] / ray['ideal']:.2f}x",
                      f"{ray['cpu_ms_per_trial']:.1f} ms", ray["succeeded"]]])
    if args.json:
        Path(args.json).write_text(json.dumps(result, default=str, indent=1))


if __name__ == "__main__":
    main()
