"""An in-memory training service for flow-logic tests: ``platform: memory`` runs each trial's Python
script in a thread of the controller's process, in virtual time, instead of starting a process.

A trial's ``trialCommand`` is ``python <script.py> [args]`` (``$NNI_TRIAL_JOB_ID`` and the other NNI
variables expanded), run from ``trialCodeDirectory`` as NNI trial code: ``import nni`` gets this trial's
parameters and records its results, ``time.sleep`` waits in the trial's virtual time, ``sys.exit``,
``os._exit``, an uncaught exception and ``print`` end and log it as they would in a process. The trial
directory holds what a local trial's does (``parameter.cfg``, ``trial.stdout``, ``trial.stderr`` and
``.nni/`` with ``started``, ``metrics`` and ``state``), so the flow, the record's audit and the output
followers read it unchanged.

Virtual time: each trial has its own clock that only :meth:`MemoryTrainingService.wait` moves, by
the ``timeout`` asked or to the script's next wake when that is later (nothing happens in between),
playing every sleep of the script that ends by then; it returns once the script sleeps again or has
ended, so a poll after it sees everything the trial did until then. Only a sliver of ``timeout``
passes in real time, so a trial that sleeps for an hour ends after as many polls as it has sleeps. A
test that must act while a trial runs holds it with a loop of short sleeps (on a file's existence).
``time.time`` and ``time.monotonic`` read the virtual clock; everything else (files, ``os``,
``random``) is real. Relative paths in ``open`` resolve against the code directory, the trial's
working directory.

Lifecycle: a trial runs from :meth:`~MemoryTrainingService.submit` until its script ends or it is
cancelled (its next sleep or result raises ``KeyboardInterrupt``: exit code 130, as SIGINT gives a
Python process). Trials outlive a closed service object, as local trials outlive their controller,
and a new service object of the same experiment adopts them; they end with the controller's
process. :func:`register` makes the platform known to this process's config loader and platform
table (it is for tests: nothing registers it otherwise).
"""

from __future__ import annotations

import builtins
import dataclasses
import os
import re
import shlex
import sys
import threading
import time
import traceback
import types
from pathlib import Path
from typing import Any, Literal

from ..config.sections.base import TrainingServiceConfig
from ..platforms.base import (
    CodeRef,
    LostHandleError,
    PlatformError,
    TrainingService,
    TrialHandle,
    TrialSpec,
    TrialStatus,
    TrialUpdate,
)
from ..platforms.local import trial_env
from ..platforms.trialdir import LOCAL, read_output_files, read_trial, read_trial_logs
from ..trial.procs import write_atomic
from ..trial.protocol import META_DIR, METRICS, STARTED, STATE, STDERR_FILE, STDOUT_FILE
from ..trial.records import MetricRecord, encode_file_record
from ..trial.runtime import CHECKPOINT_KEYS, PARAMETER_FILE

PLATFORM_NAME = "memory"
REAL_SHARE = 0.02  # the part of a wait's timeout that passes in real time (so followers never spin)
SETTLE_SECONDS = 10.0  # longest real wait for a script to sleep again or end after its clock moved
KILLED_EXIT_CODE = 130  # a Python process stopped by SIGINT


class MemoryConfig(TrainingServiceConfig):
    platform: Literal["memory"] = "memory"


class _Killed(KeyboardInterrupt):
    """Raised inside a cancelled trial's script at its next sleep or result."""


class _Run:
    """One trial's script in its thread, and its virtual clock."""

    def __init__(self, spec: TrialSpec, trial_dir: Path, script: Path, argv: list[str], env: dict[str, str]):
        self.spec, self.trial_dir, self.script, self.argv, self.env = spec, trial_dir, script, argv, env
        self.cond = threading.Condition()
        self.now = 0.0
        self.until: float | None = None  # the virtual time the script sleeps until
        self.done = self.killed = False
        self.wall_start = time.time()
        self.counters = {"PERIODICAL": 0, "FINAL": 0}
        self.fetched = False
        self.thread = threading.Thread(target=self._main, name=f"memory-trial-{spec.trial_id}", daemon=True)

    # ---- the script's side ----------------------------------------------------------------
    def sleep(self, seconds: float) -> None:
        with self.cond:
            self._check_killed()
            self.until = self.now + max(0.0, float(seconds))
            self.cond.notify_all()
            while self.now < self.until and not self.killed:
                self.cond.wait()
            self.until = None
            self._check_killed()

    def _check_killed(self) -> None:
        if self.killed:
            raise _Killed()

    def report(self, kind: str, value: Any) -> None:
        with self.cond:
            self._check_killed()
            record = MetricRecord(self.spec.trial_id, kind, self.counters[kind], value, self.spec.parameter_id)
            self.counters[kind] += 1
        with open(self.trial_dir / META_DIR / METRICS, "ab") as f:
            f.write(encode_file_record(record))

    def parameters(self) -> dict[str, Any] | None:
        if self.fetched:
            return None
        self.fetched = True
        params = dict(self.spec.parameters)
        if all(isinstance(params.get(k), str) for k in CHECKPOINT_KEYS):
            for key in CHECKPOINT_KEYS:
                params[key] = os.path.join(self.trial_dir.parent.parent, params[key])
            os.makedirs(params["save_checkpoint_dir"], exist_ok=True)
        return params

    def _main(self) -> None:
        code = 0
        with open(self.trial_dir / STDOUT_FILE, "a", buffering=1, encoding="utf-8") as out, \
                open(self.trial_dir / STDERR_FILE, "a", buffering=1, encoding="utf-8") as err:
            write_atomic(str(self.trial_dir / META_DIR / STARTED), {"pid": os.getpid(), "time": time.time()})
            try:
                source = self.script.read_text(encoding="utf-8")
                exec(compile(source, str(self.script), "exec"), self._namespace(out, err))  # noqa: S102 -- the trial
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                if exc.code is not None and not isinstance(exc.code, int):
                    err.write(f"{exc.code}\n")
            except _Killed:
                code = KILLED_EXIT_CODE
                err.write("KeyboardInterrupt\n")
            except BaseException:  # noqa: BLE001 -- the trial's own error ends it, as in a process
                code = 1
                err.write(traceback.format_exc())
        write_atomic(str(self.trial_dir / META_DIR / STATE), {"exit_code": code, "end_time": time.time()})
        with _RUNS_LOCK:
            _RUNS.pop(str(self.trial_dir), None)  # its state file speaks for it from now on
        with self.cond:
            self.done = True
            self.cond.notify_all()

    def _namespace(self, out: Any, err: Any) -> dict[str, Any]:
        views = {"nni": self._nni(), "time": self._time(), "os": self._os(), "sys": self._sys(out, err)}
        real_import = builtins.__import__

        def trial_import(name: str, globals_: Any = None, locals_: Any = None, fromlist: Any = (), level: int = 0):
            top = name.split(".")[0]
            if level == 0 and top in views and (name == top or not fromlist):
                if name != top:
                    real_import(name, globals_, locals_, fromlist, level)
                return views[top]
            return real_import(name, globals_, locals_, fromlist, level)

        def trial_print(*args: Any, file: Any = None, **kwargs: Any) -> None:
            builtins.print(*args, file=out if file is None else file, **kwargs)

        def trial_open(file: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(file, (str, os.PathLike)) and not os.path.isabs(file):
                file = os.path.join(self.spec.code_dir, file)
            return builtins.open(file, *args, **kwargs)

        own = {**vars(builtins), "__import__": trial_import, "print": trial_print, "open": trial_open}
        return {"__name__": "__main__", "__file__": str(self.script), "__builtins__": own}

    def _nni(self) -> types.ModuleType:
        return _view("nni", None, get_next_parameter=self.parameters,
                     get_current_parameter=lambda tag=None: self.spec.parameters if tag is None
                     else self.spec.parameters.get(tag),
                     report_intermediate_result=lambda metric: self.report("PERIODICAL", metric),
                     report_final_result=lambda metric: self.report("FINAL", metric),
                     get_trial_id=lambda: self.spec.trial_id, get_experiment_id=lambda: self.spec.experiment_id,
                     get_sequence_id=lambda: self.spec.sequence)

    def _time(self) -> types.ModuleType:
        return _view("time", time, sleep=self.sleep, time=lambda: self.wall_start + self.now,
                     monotonic=lambda: self.now, perf_counter=lambda: self.now)

    def _os(self) -> types.ModuleType:
        def exit_now(code: int) -> None:
            raise SystemExit(int(code))
        environ = {**os.environ, **self.env}
        return _view("os", os, environ=environ, getenv=lambda key, default=None: environ.get(key, default),
                     _exit=exit_now, getcwd=lambda: str(self.spec.code_dir))

    def _sys(self, out: Any, err: Any) -> types.ModuleType:
        return _view("sys", sys, stdout=out, stderr=err, argv=[str(self.script), *self.argv])

    # ---- the service's side -----------------------------------------------------------------
    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` on, or to the script's next wake when that is later (the trial does
        nothing in between), playing each sleep that ends by then; returns once the script sleeps past
        the new time or has ended (waiting at most :data:`SETTLE_SECONDS` of real time per step)."""
        with self.cond:
            self._settle()
            target = self.now + max(0.0, seconds)
            if self.until is not None:
                target = max(target, self.until)  # nothing happens before its next wake: no poll is lost
            while True:
                self._settle()
                if self.done or self.until is None or self.until > target:
                    break
                self.now = self.until
                self.cond.notify_all()
            self.now = max(self.now, target)
            self.cond.notify_all()
            self._settle()

    def _settle(self) -> None:
        deadline = time.monotonic() + SETTLE_SECONDS
        while not self.done and not (self.until is not None and self.until > self.now):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.cond.wait(left)

    def kill(self) -> None:
        with self.cond:
            self.killed = True
            self.cond.notify_all()
            deadline = time.monotonic() + SETTLE_SECONDS
            while not self.done and time.monotonic() < deadline:
                self.cond.wait(deadline - time.monotonic())


def _view(name: str, real: types.ModuleType | None, **overrides: Any) -> types.ModuleType:
    """A module named ``name`` with ``overrides``; other attributes come from ``real``."""
    class View(types.ModuleType):
        def __getattr__(self, attr: str) -> Any:
            if real is None:
                raise AttributeError(f"module {name!r} has no attribute {attr!r} in a memory trial")
            return getattr(real, attr)
    view = View(name)
    view.__dict__.update(overrides)
    return view


_RUNS: dict[str, _Run] = {}  # trial directory -> its run, for every service object of this process
_RUNS_LOCK = threading.Lock()
_VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")


class MemoryTrainingService(TrainingService[MemoryConfig]):
    """Trials as threads playing their scripts in virtual time (see the module's docstring)."""

    platform = PLATFORM_NAME

    def __init__(self, config: MemoryConfig, experiment_dir: Path) -> None:
        self.config = config
        self.experiment_dir = Path(experiment_dir)
        self.experiment_id = self.experiment_dir.name
        self.trials_dir = self.experiment_dir / "trials"

    def prepare(self) -> None:
        self.trials_dir.mkdir(parents=True, exist_ok=True)

    def upload_code(self, code_dir: Path) -> CodeRef:
        return CodeRef(str(code_dir))  # run in place, as local trials

    def submit(self, spec: TrialSpec, code: CodeRef) -> TrialHandle:
        """Start the trial's script in its thread. Raises :class:`PlatformError` when the command is not
        ``python <script.py>`` or the script is missing."""
        trial_dir = self.trials_dir / spec.trial_id
        (trial_dir / META_DIR).mkdir(parents=True, exist_ok=True)
        env = trial_env(spec, self.platform, str(trial_dir), code.location, None)
        script, argv = self._script(spec.command, env, Path(code.location))
        (trial_dir / PARAMETER_FILE).write_text(spec.parameter_record(), encoding="utf-8")
        run = _Run(dataclasses.replace(spec, code_dir=Path(code.location)), trial_dir, script, argv, env)
        with _RUNS_LOCK:
            if str(trial_dir) in _RUNS:
                return self._handle(spec, trial_dir)
            _RUNS[str(trial_dir)] = run
        run.thread.start()
        return self._handle(spec, trial_dir)

    def _handle(self, spec: TrialSpec, trial_dir: Path) -> TrialHandle:
        return TrialHandle(spec.trial_id, self.platform, {"trial_dir": str(trial_dir)})

    @staticmethod
    def _script(command: str, env: dict[str, str], code_dir: Path) -> tuple[Path, list[str]]:
        expanded = _VARIABLE.sub(lambda m: env.get(m.group(1) or m.group(2), m.group(0)), command)
        words = shlex.split(expanded)
        if len(words) < 2 or not os.path.basename(words[0]).startswith("python") or not words[1].endswith(".py"):
            raise PlatformError(f"the memory platform runs 'python <script.py>' trial commands, not {command!r}")
        script = code_dir / words[1]
        if not script.is_file():
            raise PlatformError(f"trial script {script} does not exist")
        return script, words[2:]

    def poll(self, handle: TrialHandle, cursor: dict[str, Any]) -> TrialUpdate:
        """Raises :class:`LostHandleError` when the trial's directory is gone."""
        trial_dir = handle.data.get("trial_dir", "")
        offset = int(cursor.get("metrics_offset", 0))
        running = trial_dir in _RUNS  # looked at first: a run leaves only after writing its state
        found = read_trial(LOCAL, trial_dir, offset, handle.trial_id)
        if found.names is None:
            raise LostHandleError(f"trial {handle.trial_id}: its directory {trial_dir} no longer exists")
        new_cursor = {"metrics_offset": found.offset}
        if found.state is not None:
            return found.update(new_cursor)
        if not running:
            return TrialUpdate(TrialStatus.SYS_CANCELED, found.records, new_cursor, None,
                               "the in-memory trial ended with the process that ran it", found.errors)
        status = TrialStatus.RUNNING if STARTED in found.names else TrialStatus.WAITING
        return TrialUpdate(status, found.records, new_cursor, None, None, found.errors)

    def wait(self, handle: TrialHandle, timeout: float) -> None:
        """Move the trial's clock ``timeout`` on (see the module's docstring)."""
        time.sleep(timeout * REAL_SHARE)
        run = _RUNS.get(handle.data.get("trial_dir", ""))
        if run is not None:
            run.advance(timeout)

    def cancel(self, handle: TrialHandle, reason: TrialStatus) -> None:
        run = _RUNS.get(handle.data.get("trial_dir", ""))
        if run is not None:
            run.kill()

    def logs(self, handle: TrialHandle, tail: int | None = None) -> dict[str, str]:
        return read_trial_logs(handle.data["trial_dir"], tail)

    output_read_seconds = 0.2

    def read_output(self, handle: TrialHandle, offsets: dict[str, int]) -> dict[str, bytes]:
        return read_output_files(handle.data["trial_dir"], offsets)

    def output_folder(self, handle: TrialHandle, name: str) -> Path | None:
        return Path(handle.data["trial_dir"]) / name


def register() -> None:
    """Make ``platform: memory`` known to this process (the config loader and the platform table)."""
    from ..config.plugins import register_platform
    from ..platforms.platform_row import Platform

    register_platform(Platform(MemoryConfig, MemoryTrainingService))
