"""GPU discovery (``nvidia-smi``) and slot scheduling for the local and remote services.

Probing is cached (``CACHE_SECONDS``) and serialised, so waiting trials never start a pile of
``nvidia-smi`` processes (NNI 3.0 #5776). A GPU has ``maxTrialNumberPerGpu`` slots; a trial asking
for ``n`` GPUs takes one slot on ``n`` distinct GPUs -- all GPUs of the machine included (NNI 3.0
never scheduled that). With ``useActiveGpu: false`` a GPU running processes that are not ours is
skipped.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

CACHE_SECONDS = 10.0
_QUERY = ["--query-gpu=index,uuid,utilization.gpu,memory.used,memory.total", "--format=csv,noheader,nounits"]
_APPS = ["--query-compute-apps=gpu_uuid,pid", "--format=csv,noheader"]


class GpuError(RuntimeError):
    """GPUs asked for but not available; the message says what to change."""


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    utilization: float
    memory_used: float
    memory_total: float
    processes: int


def parse_nvidia_smi(gpus_csv: str, apps_csv: str) -> list[GpuInfo]:
    busy: dict[str, int] = {}
    for line in apps_csv.splitlines():
        uuid = line.split(",")[0].strip()
        if uuid:
            busy[uuid] = busy.get(uuid, 0) + 1
    out = []
    for line in gpus_csv.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 5 or not parts[0].isdigit():
            continue
        num = [float(p) if p.replace(".", "", 1).isdigit() else 0.0 for p in parts[2:5]]
        out.append(GpuInfo(int(parts[0]), parts[1], num[0], num[1], num[2], busy.get(parts[1], 0)))
    return out


def run_nvidia_smi(args: list[str]) -> str:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise GpuError("nvidia-smi was not found on PATH: no NVIDIA GPU is visible on this machine")
    proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise GpuError(f"nvidia-smi failed (exit {proc.returncode}): {proc.stderr.strip()[:300]}")
    return proc.stdout


class GpuProbe:
    """Cached GPU list of one machine; ``runner`` runs nvidia-smi with arguments (local or over SSH)."""

    def __init__(self, runner: Callable[[list[str]], str] = run_nvidia_smi, cache_seconds: float = CACHE_SECONDS):
        self.runner = runner
        self.cache_seconds = cache_seconds
        self._lock = threading.Lock()
        self._cached: list[GpuInfo] | None = None
        self._at = 0.0

    def gpus(self) -> list[GpuInfo]:
        with self._lock:
            if self._cached is None or time.monotonic() - self._at > self.cache_seconds:
                self._cached = parse_nvidia_smi(self.runner(_QUERY), self.runner(_APPS))
                self._at = time.monotonic()
            return self._cached


class GpuScheduler:
    """Hands out GPU slots to trials of one machine."""

    def __init__(self, probe: GpuProbe, per_gpu: int = 1, indices: list[int] | None = None,
                 use_active_gpu: bool = False) -> None:
        self.probe, self.per_gpu, self.indices, self.use_active_gpu = probe, per_gpu, indices, use_active_gpu
        self._lock = threading.Lock()
        self._slots: dict[str, list[int]] = {}

    def usable(self) -> list[GpuInfo]:
        gpus = self.probe.gpus()
        if self.indices is not None:
            missing = sorted(set(self.indices) - {g.index for g in gpus})
            if missing:
                raise GpuError(f"gpuIndices {missing} not found; this machine has GPUs {[g.index for g in gpus]}")
            gpus = [g for g in gpus if g.index in self.indices]
        return gpus

    def check(self, gpu_number: int) -> None:
        """At start: fail when the request can never be met; the message names the setting to change."""
        try:
            gpus = self.usable()
        except GpuError as exc:  # no nvidia-smi, or it failed: no GPU is visible here
            raise GpuError(f"trialGpuNumber is {gpu_number} but {exc}; set trialGpuNumber to 0 to run the trials "
                           "without a GPU, or run on a machine with GPUs") from None
        if not gpus:
            raise GpuError(f"trialGpuNumber is {gpu_number} but no GPU is available on this machine; "
                           "set trialGpuNumber to 0 or run on a machine with GPUs")
        if gpu_number > len(gpus):
            raise GpuError(f"trialGpuNumber {gpu_number} exceeds the {len(gpus)} usable GPU(s) "
                           f"{[g.index for g in gpus]}")

    def _free(self) -> tuple[list[GpuInfo], dict[int, int]]:
        """GPUs with a free slot now, and the slots used per GPU index (call with the lock held)."""
        used: dict[int, int] = {}
        for idx in self._slots.values():
            for i in idx:
                used[i] = used.get(i, 0) + 1
        free = [g for g in self.usable()
                if used.get(g.index, 0) < self.per_gpu
                and (self.use_active_gpu or g.processes == 0 or used.get(g.index, 0) > 0)]
        return free, used

    def free_slots(self) -> tuple[int, int]:
        """(GPUs with a free slot, free slots in all: GPUs x maxTrialNumberPerGpu less those taken)."""
        with self._lock:
            free, used = self._free()
            return len(free), sum(self.per_gpu - used.get(g.index, 0) for g in free)

    def allocate(self, trial_id: str, gpu_number: int) -> list[int] | None:
        """GPU indices for the trial, or None while not enough slots are free."""
        with self._lock:
            if trial_id in self._slots:
                return self._slots[trial_id]
            free, used = self._free()
            if len(free) < gpu_number:
                return None
            free.sort(key=lambda g: (used.get(g.index, 0), g.utilization, g.memory_used, g.index))
            chosen = sorted(g.index for g in free[:gpu_number])
            self._slots[trial_id] = chosen
            return chosen

    def adopt(self, trial_id: str, indices: list[int]) -> None:
        """Re-register the GPUs of a trial re-attached after a resume."""
        with self._lock:
            self._slots[trial_id] = list(indices)

    def release(self, trial_id: str) -> None:
        with self._lock:
            self._slots.pop(trial_id, None)
