"""Chaos runs: an experiment driven to its end while its controller, trials and SSH connections are
killed at moments drawn from a seed, and the invariants checked afterwards.

Used by ``tests/reliability/`` (a short plan, fixed seed, in CI) and ``benchmarks/chaos.py`` (longer
plans). The trial script (:data:`CHAOS_TRIAL`) appends to a shared ledger (``runs.jsonl``) when it
starts, before each report (``intent``) and after each report returned (``reported``); the checks
compare that ledger with the store:

* every trial reaches exactly one terminal status (its status history has one terminal entry, and
  it is the trial's status);
* no trial runs twice, unless its history says it was resubmitted after never starting;
* every metric whose report returned before the trial ended is stored, exactly once, with its value,
  and nothing is stored that the trial never tried to report;
* ``maxTrialNumber`` is never exceeded (store, trial directories and the ledger);
* no process of the experiment is left once the controller has ended (:func:`leftover_processes`).

Each check returns the violations it found (empty when the invariant holds), so a test can show that
each one fails on a run that breaks it.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..flows.trial_loop import RESUBMITTED
from ..foundation.status import STOPPED_BY_US, TERMINAL, TrialStatus
from ..records.store import ExperimentStore

ENTRY_START = '{"kind": '  # how the trial script's ledger entries begin (``kind`` first)
CHAOS_TRIAL = """\
import fcntl, json, os, time, nni

def mark(**entry):
    entry.update(trial=nni.get_trial_id(), pid=os.getpid(), t=time.time())
    with open({ledger!r}, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(json.dumps(entry) + "\\n")

p = nni.get_next_parameter()
mark(kind="start")
for i in range({reports}):
    value = round(p["x"] + i, 6)
    mark(kind="intent", type="PERIODICAL", seq=i, value=value)
    nni.report_intermediate_result(value)
    mark(kind="reported", type="PERIODICAL", seq=i, value=value)
    time.sleep({sleep})
value = round(p["x"] * 10, 6)
mark(kind="intent", type="FINAL", seq=0, value=value)
nni.report_final_result(value)
mark(kind="reported", type="FINAL", seq=0, value=value)
"""

RUN_MARKER = "TRIALFLOW_CHAOS_EXPERIMENT"  # in every chaos controller's environment, so its children inherit it


class SshServer(Protocol):
    def drop_connections(self) -> int: ...


class FaultyApi(Protocol):
    """An API emulator's fault knobs (``trialflow.testing.emulators.kubernetes``)."""

    def fail_next(self, count: int, status: int = 503, method: str | None = None) -> None: ...

    def drop_next(self, count: int, method: str | None = None, after: bool = False) -> None: ...

    def clear_faults(self) -> None: ...


def write_chaos_trial(code_dir: Path, ledger: Path, reports: int = 3, sleep: float = 0.15) -> None:
    code_dir.mkdir(parents=True, exist_ok=True)
    (code_dir / "trial.py").write_text(CHAOS_TRIAL.format(ledger=str(ledger), reports=reports, sleep=sleep))


def read_ledger(ledger: Path) -> list[dict[str, Any]]:
    """The ledger's complete entries, in order. A trial killed while it appends an entry can leave a
    prefix of it: the kernel ends a write at a page boundary of the file when the writer has a SIGKILL
    pending. The next writer's entry then follows that prefix on the same line. Such a prefix is dropped
    (its trial was killed during that write, so it reported nothing after it); the entry after it is kept."""
    if not ledger.exists():
        return []
    entries = []
    for line in ledger.read_text().splitlines():
        start = line.rfind(ENTRY_START)  # every entry begins so, and a prefix of one holds no other start
        try:
            entries.append(json.loads(line[max(start, 0):]))
        except json.JSONDecodeError:
            pass  # the prefix alone, at the ledger's end or on a line of its own
    return entries


# ---- the driver ---------------------------------------------------------------------------------


@dataclass
class ChaosPlan:
    """How many of each fault to inject, spaced ``gap`` seconds apart (drawn uniformly)."""

    controller_kills: int = 2
    trial_kills: int = 4
    ssh_drops: int = 0
    api_faults: int = 0  # 5xx answers and dropped connections of the platform's API
    gap: tuple[float, float] = (1.0, 3.0)
    restart_delay: tuple[float, float] = (0.2, 1.5)


@dataclass
class ChaosDriver:
    """Runs one created experiment to its end through ``trialflow resume --foreground`` controllers,
    injecting the plan's faults in an order and at moments drawn from ``seed``."""

    experiment_id: str
    root: Path
    plan: ChaosPlan
    seed: int
    env: dict[str, str]
    ssh_servers: list[SshServer] = field(default_factory=list)
    api: FaultyApi | None = None
    actions: list[str] = field(default_factory=list)

    def _controller(self) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "trialflow.cli", "resume", self.experiment_id, "--root", str(self.root),
               "--foreground"]
        env = {**self.env, RUN_MARKER: self.experiment_id}
        return subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)

    def run(self, timeout: float = 600.0) -> int:
        """Drive the experiment to its end; returns the last controller's exit code."""
        rng = random.Random(self.seed)
        faults = (["controller"] * self.plan.controller_kills + ["trial"] * self.plan.trial_kills
                  + ["ssh"] * (self.plan.ssh_drops if self.ssh_servers else 0)
                  + ["api"] * (self.plan.api_faults if self.api is not None else 0))
        rng.shuffle(faults)
        deadline = time.monotonic() + timeout
        controller = self._controller()
        try:
            self._wait_running(controller, deadline)
            for fault in faults:
                if self._sleep_until_exit(controller, rng.uniform(*self.plan.gap)):
                    break  # the experiment ended before this fault
                if fault == "controller":
                    os.killpg(controller.pid, signal.SIGKILL)
                    controller.wait()
                    self.actions.append("killed the controller")
                    time.sleep(rng.uniform(*self.plan.restart_delay))
                    controller = self._controller()
                    self.actions.append("trialflow resume")
                    self._wait_running(controller, deadline)
                elif fault == "trial":
                    pids = trial_processes(self.experiment_id)
                    if pids:
                        pid = rng.choice(sorted(pids))
                        _kill(pid, signal.SIGKILL)
                        self.actions.append(f"killed trial process {pid}")
                elif fault == "api":
                    self._api_fault(rng)
                else:
                    server = rng.choice(self.ssh_servers)
                    self.actions.append(f"dropped {server.drop_connections()} SSH connections")
            return controller.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            if controller.poll() is None:
                os.killpg(controller.pid, signal.SIGKILL)
                controller.wait()
            if self.api is not None:  # faults the experiment ended before meeting are not left to others
                self.api.clear_faults()

    def _api_fault(self, rng: random.Random) -> None:
        """The API's faults in turn (5xx answers, dropped connections, a create whose answer is lost),
        so a plan of three has each kind; how many requests each hits is drawn."""
        assert self.api is not None
        done = sum(a.startswith("API ") for a in self.actions)
        count, kind = rng.randint(1, 3), ("5xx", "drop", "drop-after-create")[done % 3]
        if kind == "5xx":
            status = rng.choice([500, 502, 503])
            self.api.fail_next(count, status)
            self.actions.append(f"API answered {count} requests with HTTP {status}")
        elif kind == "drop":
            self.api.drop_next(count)
            self.actions.append(f"API dropped {count} connections")
        else:
            self.api.drop_next(1, method="POST", after=True)
            self.actions.append("API dropped a create's answer after creating")

    def _wait_running(self, controller: subprocess.Popen[bytes], deadline: float) -> None:
        """Until this controller runs the experiment (and at least one trial runs), or it ended."""
        store = ExperimentStore.embedded(self.root / self.experiment_id, self.experiment_id)
        try:
            while time.monotonic() < deadline and controller.poll() is None:
                exp = store.experiment()
                if exp.controller_pid == controller.pid and store.trials([TrialStatus.RUNNING]):
                    return
                time.sleep(0.05)
        finally:
            store.close()

    @staticmethod
    def _sleep_until_exit(controller: subprocess.Popen[bytes], seconds: float) -> bool:
        try:
            controller.wait(timeout=seconds)
            return True
        except subprocess.TimeoutExpired:
            return False


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _proc_text(pid: str, name: str) -> str:
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def trial_processes(experiment_id: str) -> list[int]:
    """Pids of the experiment's trial commands (their environment names the experiment)."""
    marker = f"NNI_EXP_ID={experiment_id} "
    return [int(pid) for pid in os.listdir("/proc") if pid.isdigit()
            and marker in _proc_text(pid, "environ") + " " and "trial.py" in _proc_text(pid, "cmdline")]


def leftover_processes(experiment_id: str, directory: str | Path) -> list[str]:
    """Live processes (not zombies) of the experiment: trials (``NNI_EXP_ID``), anything started by
    a chaos controller (:data:`RUN_MARKER`: fork servers, keepers), and anything whose command line
    names a path under ``directory`` (remote keepers and workers)."""
    env_marks = (f"NNI_EXP_ID={experiment_id} ", f"{RUN_MARKER}={experiment_id} ")
    prefix = str(directory).rstrip("/") + "/"
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        stat = _proc_text(pid, "stat")
        if not stat or stat.rsplit(")", 1)[-1].split()[:1] == ["Z"]:
            continue
        cmdline, environ = _proc_text(pid, "cmdline"), _proc_text(pid, "environ") + " "
        if prefix in cmdline or any(mark in environ for mark in env_marks):
            found.append(f"{pid}: {cmdline.strip()[:200]}")
    return found


# ---- the invariants -----------------------------------------------------------------------------


@dataclass
class RunRecord:
    """What the checks read: the store's view and the trials' own ledger."""

    trials: dict[str, str]  # trial id -> status
    histories: dict[str, list[tuple[str, str | None]]]  # trial id -> [(status, message)]
    metrics: list[tuple[str, str, int, Any]]  # (trial, type, sequence, value) rows as stored
    ledger: list[dict[str, Any]]
    trial_dirs: list[str]
    max_trials: int | None


def collect(store: ExperimentStore, ledger: Path, trials_dir: Path, max_trials: int | None) -> RunRecord:
    trials = store.trials()
    return RunRecord(
        trials={t.id: t.status for t in trials},
        histories={t.id: [(st, msg) for st, _, msg in store.status_history(t.id)] for t in trials},
        metrics=[(m.trial_id, m.type, m.sequence, m.value) for m in store.metrics()],
        ledger=read_ledger(ledger),
        trial_dirs=sorted(p.name for p in trials_dir.iterdir()) if trials_dir.is_dir() else [],
        max_trials=max_trials)


def one_terminal_status(run: RunRecord) -> list[str]:
    """Each trial ends once, in its recorded status. The one replacement the record allows: a stop
    recorded before its kill (USER_CANCELED, EARLY_STOPPED), settled to the trial's own outcome when
    it had exited by itself before the kill landed (``ExperimentStore.settle``)."""
    problems = []
    for trial_id, status in run.trials.items():
        ends = [s for s, _ in run.histories.get(trial_id, []) if s in TERMINAL]
        settled = len(ends) == 2 and ends[0] in STOPPED_BY_US and ends[1] not in STOPPED_BY_US
        if not (len(ends) == 1 or settled) or ends[-1] != status:
            problems.append(f"trial {trial_id}: status {status}, terminal history {ends}")
    return problems


def no_trial_ran_twice(run: RunRecord) -> list[str]:
    starts = Counter(e["trial"] for e in run.ledger if e["kind"] == "start")
    problems = []
    for trial_id, count in starts.items():
        resubmitted = any(m == RESUBMITTED for _, m in run.histories.get(trial_id, []))
        if count > 1 and not resubmitted:
            problems.append(f"trial {trial_id} started {count} times")
        if trial_id not in run.trials:
            problems.append(f"trial {trial_id} ran but is not in the store")
    return problems


def metrics_stored_once(run: RunRecord) -> list[str]:
    problems = []
    rows = Counter((t, k, s) for t, k, s, _ in run.metrics)
    problems += [f"metric {key} stored {n} times" for key, n in rows.items() if n > 1]
    stored = {(t, k, s): v for t, k, s, v in run.metrics}
    tried = {(e["trial"], e["type"], e["seq"]): e["value"] for e in run.ledger if e["kind"] == "intent"}
    for e in run.ledger:
        if e["kind"] == "reported" and (key := (e["trial"], e["type"], e["seq"])) not in stored:
            problems.append(f"metric {key} was reported but is not stored")
    for key, value in stored.items():
        if key not in tried:
            problems.append(f"metric {key} is stored but the trial never reported it")
        elif value != tried[key]:
            problems.append(f"metric {key} stored as {value!r}, reported as {tried[key]!r}")
    return problems


def budget_kept(run: RunRecord) -> list[str]:
    if run.max_trials is None:
        return []
    counts = {"store": len(run.trials), "trial directories": len(run.trial_dirs),
              "trials that ran": len({e["trial"] for e in run.ledger if e["kind"] == "start"})}
    return [f"{n} {what} > maxTrialNumber {run.max_trials}" for what, n in counts.items() if n > run.max_trials]


INVARIANTS = (one_terminal_status, no_trial_ran_twice, metrics_stored_once, budget_kept)


def violations(run: RunRecord) -> dict[str, list[str]]:
    """The invariants that do not hold, with what breaks them."""
    return {check.__name__: found for check in INVARIANTS if (found := check(run))}
