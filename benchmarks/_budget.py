"""Search methods compared at one shared budget of training steps (``multifidelity.py``,
``multiobjective.py``): each method and seed gets a run folder whose ``code/`` holds the workload and its
run file; the workload's trials take steps from a counter file in the run folder until the budget is
spent, and the method is stopped then.

Lifecycle: :func:`run_seeds` makes a temporary root, calls every method for every seed (seeds outermost),
and removes the root. A method prepares its folder (:func:`prepare`), starts, and waits with
:func:`wait_spent`; trialflow's methods do all three in :func:`run_trialflow`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

STALL_SECONDS = 90.0  # no training step for this long: the method is stuck

Runner = Callable[[Path, int, argparse.Namespace], Any]


class Stalled(RuntimeError):
    """The method stopped training before the budget was spent (its reason in the message)."""


def prepare(root: Path, name: str, seed: int, files: dict[str, str], run_file: str,
            run: dict[str, Any]) -> tuple[Path, Path]:
    """``root/name/seed<seed>`` with ``code/`` holding ``files`` (name -> text) and ``run_file``: ``run``
    as JSON, with the run folder as its ``run_dir``. Returns (run folder, code)."""
    run_dir = root / name / f"seed{seed}"
    code = run_dir / "code"
    code.mkdir(parents=True)
    for file, text in files.items():
        (code / file).write_text(text)
    (code / run_file).write_text(json.dumps({"run_dir": str(run_dir), **run}))
    return run_dir, code


def steps(run_dir: Path) -> int:
    """The steps taken so far from the run's budget."""
    path = run_dir / "steps"
    return int(path.read_text() or 0) if path.exists() else 0


def wait_spent(run_dir: Path, budget: int, over: Callable[[], bool], why: Callable[[], str] = lambda: "") -> None:
    """Return once ``budget`` steps are taken. Raises :class:`Stalled` when the method ends first
    (``over``) or takes no step for :data:`STALL_SECONDS`, with ``why()`` in the message."""
    last, since = -1, time.monotonic()
    while steps(run_dir) < budget:
        if over():
            raise Stalled(f"it ended after {steps(run_dir)} of {budget} steps {why()}".strip())
        if steps(run_dir) != last:
            last, since = steps(run_dir), time.monotonic()
        elif time.monotonic() - since > STALL_SECONDS:
            raise Stalled(f"no step for {STALL_SECONDS:.0f} s after {last} of {budget} steps {why()}".strip())
        time.sleep(0.2)


def _trialflow_over(exp_id: str, run_dir: Path) -> bool:
    from trialflow.experiments import open_store

    return open_store(run_dir / "w", exp_id).experiment().status not in ("RUNNING", "CREATED", "INITIALIZED")


def run_trialflow(config: dict[str, Any], run_dir: Path, budget: int) -> float:
    """``trialflow create`` the experiment ``config`` (working under ``run_dir/w``), wait until the
    budget is spent, and stop it (also when waiting fails). Returns the time of the create. Raises
    RuntimeError with create's output when it fails, :class:`Stalled` as :func:`wait_spent`."""
    path = run_dir / "config.yml"
    path.write_text(yaml.safe_dump({**config, "experimentWorkingDirectory": str(run_dir / "w")}))
    start = time.time()
    created = subprocess.run(["trialflow", "create", "--config", str(path)], capture_output=True, text=True,
                             timeout=300)
    if created.returncode:
        raise RuntimeError(f"trialflow create failed: {created.stdout}{created.stderr}")
    exp_id = created.stdout.split("experiment id: ")[1].split()[0]
    try:
        wait_spent(run_dir, budget, lambda: _trialflow_over(exp_id, run_dir))
    finally:
        subprocess.run(["trialflow", "stop", exp_id], capture_output=True, timeout=300)
    return start


def run_seeds(runners: dict[str, Runner], args: argparse.Namespace, prefix: str,
              failing: tuple[type[Exception], ...] = (Stalled,)) -> tuple[dict[str, list[Any]], dict[str, list[str]]]:
    """Every runner for each of ``args.seeds`` seeds, seeds outermost (a slow drift of the machine hits
    every method alike), under a temporary root removed at the end. Returns the results and the
    reasons of the runs that raised one of ``failing`` (anything else ends the benchmark), by method."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    results: dict[str, list[Any]] = {}
    failures: dict[str, list[str]] = {}
    try:
        for seed in range(args.seeds):
            for name, run in runners.items():
                print(f"{name} seed {seed} ...", file=sys.stderr, flush=True)
                try:
                    results.setdefault(name, []).append(run(root, seed, args))
                except failing as exc:
                    failures.setdefault(name, []).append(str(exc))
                    print(f"  {name} seed {seed} failed: {exc}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return results, failures
