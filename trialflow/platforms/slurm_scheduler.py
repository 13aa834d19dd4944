"""Slurm's commands for one experiment's jobs on the cluster's login node: ``sbatch`` (a job made once
per name), ``squeue`` (one listing of the experiment's jobs per second at most, shared by every poll)
and ``scancel``. The login node is reached over SSH with ``host`` (the remote platform's machinery),
else it is this machine; ``loginCommand`` runs before each command there. Safe to call from several
threads."""

from __future__ import annotations

import shlex
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import cast

from ..config.sections.remote import RemoteMachineConfig
from ..config.sections.slurm import SlurmConfig
from .base import PlatformError, TransientPlatformError
from .inherited_env import inherited_environment
from .remote_machine import RemoteMachine
from .ssh import SshConnection, machine_target
from .trialfs import LocalFS

_q = shlex.quote
SNAPSHOT_SECONDS = 1.0
SQUEUE_FIELDS = "JobID:|,Name:|,State:|,Reason:|,RestartCnt:|"


@dataclass(frozen=True)
class SlurmJob:
    """One line of ``squeue``: what Slurm says about a job now."""

    id: str
    name: str
    state: str
    reason: str
    restarts: int

    def describe(self) -> str:
        return f"Slurm job {self.id} is {self.state}" + (f" ({self.reason})" if self.reason not in ("None", "") else "")


class LocalShell:
    """The login node is this machine: commands run in ``/bin/sh`` here (what :class:`RemoteMachine`
    uses of an SSH connection)."""

    def run(self, command: str, stdin: bytes | None = None, timeout: float = 120.0) -> tuple[int, str, str]:
        try:
            done = subprocess.run(["/bin/sh", "-c", command], input=stdin, capture_output=True, timeout=timeout,
                                  env=inherited_environment())  # sbatch hands it on to the job
        except subprocess.TimeoutExpired as exc:
            raise TransientPlatformError(f"`{command}` did not finish within {timeout:.0f} s") from exc
        return done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")

    def close(self) -> None:
        return None


class LocalLoginNode(RemoteMachine):
    """This machine as the login node: a :class:`RemoteMachine` whose files are local."""

    def __post_init__(self) -> None:
        self.fs = LocalFS()  # type: ignore[assignment]  # the same TrialFS contract as SFTP


def login_node(config: SlurmConfig) -> RemoteMachine:
    """The login node of the section: over SSH with ``host``, else this machine."""
    if config.host:
        machine = config.login_machine()
        conn = SshConnection(machine_target(machine), config.known_hosts_file, config.trust_unknown_hosts)
        return RemoteMachine(0, machine, conn, f"{machine.user or machine.credentials}@{machine.host}:{machine.port}")
    machine = RemoteMachineConfig.model_construct(host="localhost", python_path=config.python_path,
                                                  remote_working_directory=config.remote_working_directory)
    return LocalLoginNode(0, machine, cast(SshConnection, LocalShell()), "this machine")


class SlurmScheduler:
    """Slurm on the login node of a ``slurm`` section, for the jobs of experiment ``experiment_id``
    (named ``tf-<experiment>-...``)."""

    def __init__(self, config: SlurmConfig, experiment_id: str) -> None:
        self.config = config
        self.experiment_id = experiment_id
        self.login = login_node(config)
        self._lock = threading.Lock()
        self._snapshot: dict[str, SlurmJob] = {}
        self._snapshot_at = 0.0

    def run(self, command: str, timeout: float = 60.0) -> str:
        """A Slurm command on the login node (after ``loginCommand``); its stdout. Raises
        ``PlatformError`` with Slurm's message when it fails; a controller Slurm cannot reach now
        (``slurm_load_*`` errors, timeouts) is transient."""
        prefix = f"{self.config.login_command}\n" if self.config.login_command else ""
        status, out, err = self.login.conn.run(prefix + command, None, timeout)
        if status != 0:
            said = " / ".join(line.strip() for line in (err or out).strip().splitlines()[-3:])[-500:]
            message = f"`{command.split()[0]}` failed on {self.login.key} (exit {status}): {said}"
            if "Unable to contact" in err or "Socket timed out" in err or "Connection refused" in err:
                raise TransientPlatformError(message)
            raise PlatformError(message)
        return out

    def jobs(self, fresh: bool = False) -> dict[str, SlurmJob]:
        """The experiment's jobs Slurm knows, by name (one ``squeue`` per second at most)."""
        with self._lock:
            if not fresh and time.monotonic() - self._snapshot_at < SNAPSHOT_SECONDS:
                return self._snapshot
        taken = time.monotonic()
        out = self.run(f"squeue --me -h -t all -O {_q(SQUEUE_FIELDS)}")
        prefix = f"tf-{self.experiment_id}-"
        found: dict[str, SlurmJob] = {}
        for line in out.splitlines():
            fields = [f.strip() for f in line.split("|")]
            if len(fields) >= 5 and fields[1].startswith(prefix):
                job = SlurmJob(fields[0], fields[1], fields[2].split()[0], fields[3],
                               int(fields[4]) if fields[4].isdigit() else 0)
                if job.name not in found or int(job.id) > int(found[job.name].id):
                    found[job.name] = job
        with self._lock:
            if taken >= self._snapshot_at:
                self._snapshot, self._snapshot_at = found, taken
        return found

    def job(self, name: str) -> SlurmJob | None:
        """Slurm's view of the job ``name``; a job missing from the last listing is looked up afresh."""
        return self.jobs().get(name) or self.jobs(fresh=True).get(name)

    def sbatch(self, name: str, script: str, options: list[str]) -> str:
        """Submit ``script`` as job ``name`` unless a job of that name exists; returns its id."""
        existing = self.jobs(fresh=True).get(name)
        if existing is not None:
            return existing.id
        cfg = self.config
        args = ["sbatch", "--parsable", f"--job-name={name}", *options]
        for flag, value in (("--partition", cfg.partition), ("--account", cfg.account), ("--qos", cfg.qos),
                            ("--time", cfg.time_limit), ("--mem", cfg.memory)):
            if value:
                args.append(f"{flag}={value}")
        args.append(f"--cpus-per-task={cfg.cpus_per_trial}")
        gpus = cfg.gpus_per_trial if cfg.gpus_per_trial is not None else cfg.trial_gpu_number
        if gpus:
            args.append(f"--gres=gpu:{gpus}")
        args += [*cfg.sbatch_options, script]
        return self.run(" ".join(_q(a) for a in args)).strip().split(";")[0]

    def scancel(self, job_id: str) -> None:
        if job_id:
            self.run(f"scancel {_q(job_id)}")
