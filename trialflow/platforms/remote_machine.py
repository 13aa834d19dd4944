"""The machines of a remote experiment's ``machineList``: one SSH login each, what was found there
(Python, home, ``PATH``, the working directory, the runtime, GPUs), and which machine a trial goes to.

Lifecycle. :meth:`RemoteMachine.probe` then :meth:`RemoteMachine.install_runtime` run once per
controller (``prepare``, or lazily for a CLI command on a stored handle); :meth:`RemoteMachine.use_gpus`
when the experiment asks for GPUs. :class:`Placements` is shared by every submitting thread (one
lock); a machine's ``active`` set is guarded by that service's lock. Every method here raises
``PlatformError`` for what the user must fix (no Python, a failed command) and
``TransientPlatformError`` when the connection drops; ``nvidia_smi`` raises ``GpuError``."""

from __future__ import annotations

import posixpath
import re
import shlex
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ..config.sections.remote import RemoteMachineConfig
from ..trial.procs import write_atomic
from .errors import PlatformError
from .gpu import GpuError, GpuProbe, GpuScheduler
from .ownership import owned_folders
from .runtime_files import runtime_files, runtime_key
from .sftpfs import SftpFS
from .ssh import SshConnection
from .trialdir import install_tree

MIN_PYTHON = (3, 8)
_q = shlex.quote


def machine_key(config: RemoteMachineConfig) -> str:
    return f"{config.user or config.credentials}@{config.host}:{config.port}"


@dataclass
class RemoteMachine:
    """One ``machineList`` entry: its SSH connection, where things live on it, and its load."""

    index: int
    config: RemoteMachineConfig
    conn: SshConnection
    key: str
    python: str = "python3"
    root: str = ""
    runtime: str = ""
    path_env: str = ""
    gpu: GpuScheduler | None = None
    active: set[str] = field(default_factory=set)
    last_heartbeat: float = 0.0
    fs: SftpFS = field(init=False)

    def __post_init__(self) -> None:
        self.fs = SftpFS(self.conn, self.key, lambda target, digest: self.command("unpack", target, digest))

    def command(self, module: str, *args: str) -> str:
        """A shell command running a runtime module with its arguments quoted."""
        return (f"PYTHONPATH={_q(self.runtime)} {_q(self.python)} -S -m trialflow.trial.{module} "
                + " ".join(_q(a) for a in args))

    def run(self, command: str, stdin: bytes | None = None, timeout: float = 120.0) -> str:
        status, out, err = self.conn.run(command, stdin, timeout)
        if status != 0:
            raise PlatformError(f"{self.key}: `{command}` failed (exit {status}): {(err or out).strip()[-500:]}")
        return out

    def probe(self) -> None:
        """Find Python (``pythonPath`` first), the login's ``PATH`` and the working directory."""
        config = self.config
        prefix = f"PATH={_q(config.python_path)}:\"$PATH\"; export PATH; " if config.python_path else ""
        script = (prefix + 'for p in python3 python; do if command -v "$p" >/dev/null 2>&1; then '
                  'P=$(command -v "$p"); break; fi; done; '
                  'echo "$P"; echo "$HOME"; echo "$PATH"; '
                  '[ -n "$P" ] && "$P" -c "import sys; print(\'%d.%d\' % sys.version_info[:2])"')
        lines = self.run(f"sh -c {_q(script)}").splitlines()
        needed = ".".join(map(str, MIN_PYTHON))
        if len(lines) < 4 or not lines[0]:
            raise PlatformError(f"{self.key}: no python3 found on the machine's PATH; install Python "
                                f">= {needed} or set pythonPath to its folder")
        self.python, home, self.path_env, version = lines[:4]
        if tuple(int(v) for v in version.split(".")) < MIN_PYTHON:
            raise PlatformError(f"{self.key}: {self.python} is Python {version}; trials need Python >= {needed} "
                                "(set pythonPath)")
        root = config.remote_working_directory
        if root == "~" or root.startswith("~/"):
            root = home + root[1:]
        elif not root.startswith("/"):
            root = posixpath.join(home, root)
        self.root = posixpath.normpath(root)

    def shared_root(self) -> str | None:
        """Why the working directory is not trialflow's own to clean (``"/"``, a user's home folder, by
        its real path), or None. Raises :class:`PlatformError` when the machine does not answer."""
        script = ('r=$(cd "$1" 2>/dev/null && pwd -P) || exit 0; echo "$r"; '
                  '{ echo "$HOME"; getent passwd 2>/dev/null | cut -d: -f6; } | while IFS= read -r h; do '
                  '[ -n "$h" ] && [ -d "$h" ] && (cd "$h" 2>/dev/null && pwd -P); done; true')
        lines = self.run(f"sh -c {_q(script)} trialflow-root {_q(self.root)}").splitlines()
        if not lines:
            return None
        if lines[0] == "/":
            return "the root folder"
        return "a home folder" if lines[0] in lines[1:] else None

    def install_runtime(self) -> None:
        """The trial runtime under ``<root>/runtime/<version>-<hash>``, once per version."""
        self.runtime = posixpath.join(self.root, "runtime", runtime_key())
        install_tree(self.fs, self.runtime, runtime_files())

    def nvidia_smi(self, args: list[str]) -> str:
        status, out, err = self.conn.run(f"PATH={_q(self.path_env)} nvidia-smi " + " ".join(map(_q, args)))
        if status == 127:
            raise GpuError(f"nvidia-smi was not found on {self.key}: no NVIDIA GPU is visible there")
        if status != 0:
            raise GpuError(f"nvidia-smi failed on {self.key} (exit {status}): {err.strip()[:300]}")
        return out

    def use_gpus(self) -> None:
        """Schedule GPUs from the machine's own ``nvidia-smi`` with its ``machineList`` limits."""
        self.gpu = GpuScheduler(GpuProbe(self.nvidia_smi),
                                self.config.max_trial_number_per_gpu, self.config.gpu_indices,
                                self.config.use_active_gpu)

    def placement_rank(self, gpu_number: int) -> tuple[int, int, int, int]:
        """Lower is better: room for the trial's GPUs now, most free GPU slots, fewest trials."""
        if not gpu_number or self.gpu is None:
            return (0, 0, len(self.active), self.index)
        gpus_free, slots_free = self.gpu.free_slots()
        return (0 if gpus_free >= gpu_number else 1, -slots_free, len(self.active), self.index)


class Placements:
    """Which machine runs which trial, until the trial ends.

    The machine with room for the trial's GPUs now (most free GPU slots first), then the least busy
    one; without GPUs the least busy one. A submission made again keeps the first choice, also after
    a controller restart (the choice is written under ``record_dir`` before the trial is sent): the
    first attempt may have started the trial there before its answer was lost, and the machine's
    claim lock then keeps it from running twice."""

    def __init__(self, machines: list[RemoteMachine], record_dir: Path) -> None:
        self.machines = machines
        self.by_key = {m.key: m for m in machines}
        self.record_dir = record_dir
        self._placed: dict[str, RemoteMachine] = {}
        self._lock = threading.Lock()

    def place(self, trial_id: str, gpu_number: int) -> RemoteMachine:
        record = self.record_dir / trial_id
        with self._lock:
            placed = self._placed.get(trial_id)
            if placed is None and record.is_file():
                placed = self.by_key.get(record.read_text().strip())
            if placed is None:
                placed = min((m for m in self.machines if not gpu_number or m.gpu is not None),
                             key=lambda m: m.placement_rank(gpu_number))
                record.parent.mkdir(parents=True, exist_ok=True)
                write_atomic(str(record), placed.key)
            self._placed[trial_id] = placed
            return placed

    def forget(self, trial_id: str) -> None:
        with self._lock:
            self._placed.pop(trial_id, None)


def clean_machines(machines: list[RemoteMachine], dry_run: bool = False,
                   files: re.Pattern[str] | None = None) -> list[str]:
    """``trialflow platform clean`` on machines: under each working directory, trialflow's marked folders
    (see :mod:`~trialflow.platforms.ownership`) and the files whose names match ``files``; nothing else is
    touched, no link followed; the folder itself goes when that leaves it empty. Returns what was
    (``dry_run``: would be) removed, as ``machine:path``. Raises :class:`PlatformError` before removing
    anything when a working directory is ``/`` or a home folder (it is not trialflow's to clean), or a
    machine does not answer."""
    found: list[tuple[RemoteMachine, str]] = []
    for machine in machines:
        machine.probe()
        shared = machine.shared_root()
        if shared:
            raise PlatformError(f"{machine.key}: remoteWorkingDirectory {machine.root} is {shared}; platform "
                                "clean removes only from a folder of trialflow's own: remove what trialflow left "
                                "there by hand")
        names = sorted(machine.fs.listdir(machine.root) or {}) if files is not None else []
        matched = [machine.fs.join(machine.root, n) for n in names if files is not None and files.fullmatch(n)]
        found += [(machine, path) for path in owned_folders(machine.fs, machine.root) + matched
                  if machine.fs.kind(path) in ("dir", "file")]
    if not dry_run:
        for machine, path in found:
            if machine.fs.kind(path) == "dir":
                machine.fs.remove_tree(path)
            else:
                machine.fs.remove(path)
        for machine in {id(m): m for m, _ in found}.values():
            machine.conn.run(f"rmdir {_q(machine.root)} 2>/dev/null; true")
    return [f"{machine.key}:{path}" for machine, path in found]
