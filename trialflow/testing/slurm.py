"""A real, throwaway single-node Slurm cluster on 127.0.0.1 for tests and benchmarks.

:class:`LoopbackSlurm` writes a munge key and a ``slurm.conf`` into a private directory, starts
``munged``, ``slurmctld`` and ``slurmd`` (Debian's ``munge`` and ``slurm-wlm``) in the foreground as
children of the calling process -- each gets SIGKILL if that process dies, so the cluster stops by
itself -- and waits until its node is idle. Commands reach it through ``SLURM_CONF`` (see
:attr:`env`). :meth:`stop` (or the context manager) cancels every job, stops the daemons and removes
the directory. The two daemons' ports come from :func:`~trialflow.testing.ports.free_port`; when
another program binds one first, the cluster starts again on others (:func:`~trialflow.testing.ports.on_a_free_port`).

The configuration suits a container or VM without cgroups: ``proctrack/linuxproc``, ``task/none``,
no accounting. The node claims ``cpus`` CPUs whatever the machine has (``config_overrides``), so
tests can run several one-CPU jobs at once on a small machine.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from . import ports

DAEMONS = {"munged": "/usr/sbin/munged", "slurmctld": "/usr/sbin/slurmctld", "slurmd": "/usr/sbin/slurmd"}


class SlurmUnavailable(RuntimeError):
    """Slurm or munge is not installed (Debian: ``apt-get install slurm-wlm munge``)."""


def _die_with_parent() -> None:
    """Runs in the daemon's child process: SIGKILL when the process that started it ends."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class LoopbackSlurm:
    """One slurmctld and one slurmd (node ``node``, partition ``debug``) on 127.0.0.1. Attributes
    after :meth:`start`: ``conf`` (the ``slurm.conf``), ``env`` (``{"SLURM_CONF": ...}``),
    ``directory``."""

    def __init__(self, directory: Path | None = None, cpus: int = 16) -> None:
        missing = [path for path in (*DAEMONS.values(), "/usr/bin/sbatch") if not os.path.exists(path)]
        if missing:
            raise SlurmUnavailable(f"{', '.join(missing)} not found; install Debian's slurm-wlm and munge")
        self.directory = Path(directory or tempfile.mkdtemp(prefix="trialflow-slurm-"))
        self.cpus = cpus
        self.node = socket.gethostname().split(".")[0]
        self.procs: list[subprocess.Popen[bytes]] = []
        self.controller: subprocess.Popen[bytes] | None = None  # slurmctld, among procs

    @property
    def conf(self) -> Path:
        return self.directory / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *args: str, check: bool = True) -> str:
        """A Slurm command against this cluster; returns its stdout."""
        done = subprocess.run(list(args), env={**os.environ, **self.env}, capture_output=True, text=True,
                              timeout=60)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        return done.stdout

    def _write_files(self, ctld_port: int, slurmd_port: int) -> None:
        """The key, ``slurm.conf`` and folders of one launch; an earlier launch's logs and munge socket go."""
        d = self.directory
        d.mkdir(parents=True, exist_ok=True)
        for stale in (*d.glob("*.log"), *d.glob("*.out"), d / "munge.socket"):
            stale.unlink(missing_ok=True)
        d.chmod(0o700)
        key = d / "munge.key"
        key.unlink(missing_ok=True)  # read-only once written
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        user = "root" if os.geteuid() == 0 else os.environ.get("USER", "root")
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20 // 2
        self.conf.write_text("\n".join([
            "ClusterName=trialflow-test", f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}", f"SlurmdPort={slurmd_port}", f"SlurmUser={user}",
            "AuthType=auth/munge", f"AuthInfo=socket={d / 'munge.socket'}", "CredType=cred/munge",
            f"StateSaveLocation={d / 'state'}", f"SlurmdSpoolDir={d / 'spool'}",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}", f"SlurmdPidFile={d / 'slurmd.pid'}",
            f"SlurmctldLogFile={d / 'slurmctld.log'}", f"SlurmdLogFile={d / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core", "ReturnToService=2", "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none", "SlurmdParameters=config_overrides",
            "MpiDefault=none", "KillWait=2", "MinJobAge=300", "SchedulerParameters=sched_interval=2",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={memory} State=UNKNOWN",
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP", "",
        ]))
        for sub in ("state", "spool"):
            (d / sub).mkdir(exist_ok=True)

    def _daemon(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = open(self.directory / f"{name}.out", "ab")  # noqa: SIM115 -- handed to the daemon
        try:
            proc = subprocess.Popen([DAEMONS[name], *args], env={**os.environ, **self.env}, stdout=log, stderr=log,
                                    preexec_fn=_die_with_parent)
        finally:
            log.close()
        self.procs.append(proc)
        return proc

    def start(self, timeout: float = 30.0) -> LoopbackSlurm:
        """Start munged, slurmctld and slurmd and wait until the node is idle, each launch within
        ``timeout`` seconds. Raises RuntimeError with the daemons' logs when one exits or the node does
        not come up (the daemons stopped, the directory kept), :class:`~trialflow.testing.ports.PortTaken`
        when a port stayed taken for every launch."""
        return ports.on_a_free_port(lambda ctld_port: self._start_on(ctld_port, timeout))

    def _start_on(self, ctld_port: int, timeout: float) -> LoopbackSlurm:
        self._write_files(ctld_port, ports.free_port())
        d = self.directory
        self._daemon("munged", "-F", "--force", f"--key-file={d / 'munge.key'}", f"--socket={d / 'munge.socket'}",
                     f"--pid-file={d / 'munged.pid'}", f"--log-file={d / 'munged.log'}",
                     f"--seed-file={d / 'munged.seed'}")
        deadline = time.monotonic() + timeout
        while not (d / "munge.socket").exists():
            self._check_alive(deadline, "munged")
        self.controller = self._daemon("slurmctld", "-D", "-c", "-f", str(self.conf))
        self._daemon("slurmd", "-D", "-f", str(self.conf))
        while True:
            self._check_alive(deadline, "the node")
            if self.run("sinfo", "-h", "-N", "-o", "%T", check=False).strip() == "idle":
                return self

    def _check_alive(self, deadline: float, what: str) -> None:
        for proc in self.procs:
            if proc.poll() is not None:
                logs = [p.read_text(errors="replace") for p in sorted(self.directory.glob("*.log"))]
                self.stop(remove=False)
                tails = "".join(log[-800:] for log in logs)
                raise ports.exit_error(f"{proc.args!r} exited with {proc.returncode}: {tails}", "".join(logs))
        if time.monotonic() > deadline:
            self.stop(remove=False)
            raise RuntimeError(f"{what} did not come up within the timeout; logs in {self.directory}")
        time.sleep(0.1)

    def jobs(self) -> list[str]:
        """Ids of the jobs Slurm knows (any state)."""
        return self.run("squeue", "-h", "-t", "all", "-o", "%i", check=False).split()

    def stop(self, remove: bool = True) -> None:
        """Cancel every job, stop the daemons (slurmd first) and optionally remove the directory."""
        if self.controller is not None and self.controller.poll() is None:  # scancel waits long for one gone
            self.run("scancel", "--full", "--user", "root" if os.geteuid() == 0 else os.environ.get("USER", ""),
                     check=False)
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.procs, self.controller = [], None
        if remove:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> LoopbackSlurm:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
