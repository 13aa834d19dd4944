"""Virtualenvs for benchmarks: NNI 3.0's and Ray Tune's to compare with, and a clean one for trialflow.

Why a clean one for trialflow: every Python process pays for the ``.pth`` files of its site-packages at
start-up, and a trial is a Python process. A development checkout (``pip install -e .``: setuptools'
finder, which imports ``pathlib`` and more) and a machine's own ``.pth`` files (this VM's imports
certifi) make ``python -c pass`` cost 30 ms of CPU here against 8 ms in a clean venv: measured on a
2-core VM, that moved 2,000 x 1 s trials at concurrency 16 from 1.17x to 1.11x ideal. NNI's and Ray's
figures come from clean venvs, so trialflow's should too. :func:`trialflow_venv` installs this checkout
as a plain path entry (setuptools' ``compat`` editable mode: no import at start-up), so the benchmark
still runs the checkout's code.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYTHON = Path("bin") / "python"


def create_venv(venv: Path, *pip_args: str) -> None:
    """Create ``venv`` and ``pip install`` ``pip_args`` into it. Raises CalledProcessError if either fails."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / PYTHON), "-m", "pip", "install", "-q", *pip_args], check=True)


@contextmanager
def nni_experiment(venv: Path, config: Path, home: Path, timeout: float = 300) -> Iterator[int]:
    """NNI 3.0's experiment of ``config``, created by ``venv``'s ``nnictl create`` on a free port of
    127.0.0.1 with ``home`` (created when missing) as its ``HOME``: nnictl keeps its list of experiments
    there, so the user's own NNI experiments are neither listed nor stopped. Yields the port of its REST
    API; on leaving, stops that experiment alone (``nnictl stop --port``), also when the create failed.
    Raises CalledProcessError if the create fails."""
    from trialflow.testing.ports import free_port

    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HOME": str(home)}
    nnictl = str(venv / "bin" / "nnictl")
    port = free_port()
    try:
        subprocess.run([nnictl, "create", "--config", str(config), "--port", str(port)], env=env, check=True,
                       capture_output=True, timeout=timeout)
        yield port
    finally:
        subprocess.run([nnictl, "stop", "--port", str(port)], env=env, capture_output=True, timeout=timeout)


def trialflow_venv(venv: Path) -> Path:
    """``venv`` holding trialflow's dependencies and this checkout on its path; created when missing.
    Returns its Python."""
    if not (venv / "bin" / "trialflow").exists():  # the console script: pip finished
        create_venv(venv, "-e", str(REPO), "--config-settings", "editable_mode=compat")
    return venv / PYTHON


FLAG = "--venv"


def add_venv_option(parser: argparse.ArgumentParser) -> None:
    """The ``--venv DIR`` option of the benchmarks that run trialflow (pass its value to :func:`rerun_in`)."""
    parser.add_argument(FLAG, type=Path, help="run trialflow in this clean virtualenv (created when missing; "
                        "see benchmarks/_venv.py)")


def rerun_in(venv: Path | None) -> None:
    """With ``venv`` given and this process not its Python: replace this process by the same command
    line (less ``--venv DIR``) run by the venv's Python, creating the venv first. Returns otherwise."""
    if venv is None or Path(sys.prefix).resolve() == venv.resolve():
        return
    python = trialflow_venv(venv)
    argv, args = [], iter(sys.argv[1:])
    for arg in args:
        if arg == FLAG:
            next(args, None)
        elif not arg.startswith(f"{FLAG}="):
            argv.append(arg)
    main = sys.modules["__main__"]
    head = ["-m", main.__spec__.name] if getattr(main, "__spec__", None) else [sys.argv[0]]
    sys.stdout.flush()
    os.execv(python, [str(python), *head, *argv])


def interpreter_start_ms(python: str = sys.executable, runs: int = 10) -> float:
    """Median CPU milliseconds of ``python -c pass``: what every trial's interpreter costs before its code."""
    costs = []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([python, "-c", "pass"], check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        costs.append(1000 * (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime))
    return statistics.median(costs)
