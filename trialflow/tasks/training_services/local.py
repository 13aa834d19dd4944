"""Local training service: each trial is a real process group on this machine.

A trial runs under the trial keeper (``trialflow.trial.keeper``) in its own session, with
cwd = ``trialCodeDirectory`` (NNI semantics: the code runs in place) and its own directory
``<experiment dir>/trials/<trial id>/`` (``NNI_SYS_DIR`` = ``NNI_OUTPUT_DIR``) holding
``parameter.cfg``, ``trial.stdout``, ``trial.stderr``, ``trial.log`` and ``.nni/metrics``.
Trials outlive a killed controller and are re-attached from their handle on resume. Trials that
ask for GPUs wait (WAITING) until the scheduler has free slots, then get ``CUDA_VISIBLE_DEVICES``.
Cancel sends SIGINT, then SIGTERM, then SIGKILL to the whole process group.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ...config import LocalConfig
from ...trial import NNI_SHIM_DIR, RUNTIME_ROOT
from ...trial.procs import kill_group, pid_alive, read_json, write_atomic
from ...trial.records import parse_file_frames
from ...trial.runtime import METRICS_FILE, PARAMETER_FILE
from .base import (
    CodeRef,
    LostHandleError,
    PlatformError,
    TrainingService,
    TrialHandle,
    TrialSpec,
    TrialStatus,
    TrialUpdate,
)
from .gpu import GpuError, GpuProbe, GpuScheduler

STDERR_TAIL_BYTES = 2000
READ_CHUNK = 4 * 1024 * 1024


def trial_env(spec: TrialSpec, platform: str, trial_dir: str, code_dir: str, gpus: list[int] | None
              ) -> dict[str, str]:
    """NNI's trial environment (nni-contract.md §3.1) plus the runtime on PYTHONPATH."""
    env = {
        "NNI_PLATFORM": platform, "NNI_EXP_ID": spec.experiment_id, "NNI_TRIAL_JOB_ID": spec.trial_id,
        "NNI_SYS_DIR": trial_dir, "NNI_OUTPUT_DIR": trial_dir, "NNI_CODE_DIR": code_dir,
        "NNI_TRIAL_SEQ_ID": str(spec.sequence), "TRIALFLOW_METRIC_CHANNEL": "file",
    }
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
    elif spec.gpu_number == 0:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def tail_text(path: str, limit: int = STDERR_TAIL_BYTES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


def read_metrics_file(trial_dir: str | Path, offset: int, trial_id: str) -> tuple[list[Any], list[str], int]:
    """Metric records of ``<trial dir>/.nni/metrics`` after byte ``offset``: (records, errors, new offset)."""
    try:
        with open(os.path.join(trial_dir, METRICS_FILE), "rb") as f:
            f.seek(offset)
            data = f.read(READ_CHUNK)
    except FileNotFoundError:
        return [], [], offset
    result = parse_file_frames(data, offset, trial_id)
    return result.records, result.errors, result.offset


def read_trial_logs(trial_dir: str | Path, tail: int | None = None) -> dict[str, str]:
    """A trial directory's log files by name (the last ``tail`` bytes of each when given)."""
    out = {}
    for name in ("trial.stdout", "trial.stderr", "trial.log"):
        path = os.path.join(trial_dir, name)
        if os.path.exists(path):
            out[name] = tail_text(path, tail) if tail else Path(path).read_text("utf-8", "replace")
    return out


class LocalTrainingService(TrainingService):
    platform = "local"

    def __init__(self, config: LocalConfig, experiment_dir: Path, kill_grace_seconds: float = 2.0,
                 gpu_probe: GpuProbe | None = None) -> None:
        self.config = config
        self.trials_dir = Path(experiment_dir) / "trials"
        self.kill_grace = kill_grace_seconds
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()
        self.gpu: GpuScheduler | None = None
        if config.trial_gpu_number:
            self.gpu = GpuScheduler(gpu_probe or GpuProbe(), config.max_trial_number_per_gpu,
                                    config.gpu_indices, bool(config.use_active_gpu))

    # ---- lifecycle ----------------------------------------------------------------------

    def prepare(self) -> None:
        self.trials_dir.mkdir(parents=True, exist_ok=True)
        if self.gpu is not None:
            try:
                self.gpu.check(self.config.trial_gpu_number or 0)
            except GpuError as exc:
                raise PlatformError(str(exc)) from None

    def upload_code(self, code_dir: Path) -> CodeRef:
        return CodeRef(str(code_dir))  # local trials run in place (NNI semantics)

    def submit(self, spec: TrialSpec, code: CodeRef) -> TrialHandle:
        trial_dir = self.trials_dir / spec.trial_id
        (trial_dir / ".nni").mkdir(parents=True, exist_ok=True)
        (trial_dir / PARAMETER_FILE).write_text(spec.parameter_record(), encoding="utf-8")
        handle = TrialHandle(spec.trial_id, self.platform, {
            "trial_dir": str(trial_dir), "code_dir": code.location, "command": spec.command,
            "sequence": spec.sequence, "experiment_id": spec.experiment_id, "gpu_number": spec.gpu_number,
            "parameter_id": spec.parameter_id})
        self._try_start(handle)
        return handle

    def _try_start(self, handle: TrialHandle) -> bool:
        """Start the keeper unless it already runs; False while waiting for GPUs."""
        data = handle.data
        meta = os.path.join(data["trial_dir"], ".nni")
        with self._lock:
            if handle.trial_id in self._procs or os.path.exists(os.path.join(meta, "keeper.pid")):
                return True
            gpus = None
            if self.gpu is not None and data.get("gpu_number"):
                gpus = self.gpu.allocate(handle.trial_id, data["gpu_number"])
                if gpus is None:
                    return False
            spec = TrialSpec(data["experiment_id"], handle.trial_id, data["sequence"], data["parameter_id"], {},
                             data["command"], Path(data["code_dir"]), data.get("gpu_number"))
            env = trial_env(spec, self.platform, data["trial_dir"], data["code_dir"], gpus)
            paths = [NNI_SHIM_DIR, RUNTIME_ROOT, os.environ.get("PYTHONPATH", "")]
            env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
            write_atomic(os.path.join(meta, "keeper.json"),
                         {"command": data["command"], "cwd": data["code_dir"], "env": env, "gpus": gpus})
            with open(os.path.join(meta, "keeper.log"), "ab") as log:
                # -S: the keeper is standard-library only; skipping site-packages saves ~50 ms per trial.
                proc = subprocess.Popen([sys.executable, "-S", "-m", "trialflow.trial.keeper", data["trial_dir"]],
                                        stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                                        env={**os.environ, "PYTHONPATH": env["PYTHONPATH"]})
            self._procs[handle.trial_id] = proc
            write_atomic(os.path.join(meta, "keeper.pid"), {"pid": proc.pid, "time": time.time()})
            return True

    def _keeper_pid(self, handle: TrialHandle) -> int | None:
        info = read_json(os.path.join(handle.data["trial_dir"], ".nni", "keeper.pid"))
        return int(info["pid"]) if info else None

    def _keeper_alive(self, handle: TrialHandle, pid: int) -> bool:
        proc = self._procs.get(handle.trial_id)
        if proc is not None:
            return proc.poll() is None
        return pid_alive(pid)

    def poll(self, handle: TrialHandle, cursor: dict[str, Any]) -> TrialUpdate:
        trial_dir = handle.data.get("trial_dir")
        if not trial_dir or not os.path.isdir(trial_dir):
            raise LostHandleError(f"trial {handle.trial_id}: its directory {trial_dir} no longer exists")
        offset = int(cursor.get("metrics_offset", 0))
        if not self._try_start(handle):
            return TrialUpdate(TrialStatus.WAITING, cursor={"metrics_offset": offset})
        meta = os.path.join(trial_dir, ".nni")
        state = read_json(os.path.join(meta, "state"))  # read before metrics: all metrics precede it
        records, errors, offset = read_metrics_file(trial_dir, offset, handle.trial_id)
        new_cursor = {"metrics_offset": offset}
        if state is not None:
            self._finish(handle)
            code = int(state["exit_code"])
            if code == 0:
                return TrialUpdate(TrialStatus.SUCCEEDED, records, new_cursor, 0, None, errors)
            tail = tail_text(os.path.join(trial_dir, "trial.stderr"))
            return TrialUpdate(TrialStatus.FAILED, records, new_cursor, code,
                               f"exit code {code}" + (f"; stderr tail:\n{tail}" if tail else ""), errors)
        pid = self._keeper_pid(handle)
        if pid is not None and not self._keeper_alive(handle, pid) and read_json(os.path.join(meta, "state")) is None:
            self._finish(handle)
            return TrialUpdate(TrialStatus.SYS_CANCELED, records, new_cursor, None,
                               "the trial's process group ended without recording an exit code (killed)", errors)
        started = os.path.exists(os.path.join(meta, "started"))
        return TrialUpdate(TrialStatus.RUNNING if started else TrialStatus.WAITING, records, new_cursor, None, None,
                           errors)

    def _finish(self, handle: TrialHandle) -> None:
        proc = self._procs.pop(handle.trial_id, None)
        if proc is not None:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if self.gpu is not None:
            self.gpu.release(handle.trial_id)

    def wait(self, handle: TrialHandle, timeout: float) -> None:
        proc = self._procs.get(handle.trial_id)
        if proc is None:
            time.sleep(timeout)
            return
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass

    def cancel(self, handle: TrialHandle, reason: TrialStatus) -> None:
        pid = self._keeper_pid(handle)
        if pid is not None and self._keeper_alive(handle, pid):
            kill_group(pid, self.kill_grace)
        self._finish(handle)

    def adopt(self, handle: TrialHandle) -> None:
        """Re-attach a trial started by an earlier controller (resume): re-register its GPUs."""
        keeper = read_json(os.path.join(handle.data["trial_dir"], ".nni", "keeper.json"))
        if self.gpu is not None and keeper and keeper.get("gpus"):
            self.gpu.adopt(handle.trial_id, keeper["gpus"])

    def logs(self, handle: TrialHandle, tail: int | None = None) -> dict[str, str]:
        return read_trial_logs(handle.data["trial_dir"], tail)

    def close(self) -> None:
        for proc in list(self._procs.values()):
            if proc.poll() is not None:
                proc.wait()
