"""A real OpenSSH server on 127.0.0.1 for tests and benchmarks.

:class:`LoopbackSshd` generates its own host key and user key in a private directory, writes an
``sshd_config`` that accepts only that key (and, when asked, passwords) for the current user,
listens on a free loopback port, and is stopped (process and directory) by :meth:`stop` or the
context manager. A ``known_hosts`` file holding the host key is written beside it so clients can
check the host key as in production. Sessions get a ``$HOME`` of their own in that directory
(:attr:`LoopbackSshd.home`): the real user's shell start-up files never run for them.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

from .owned import popen_watched
from .ports import on_a_free_port, wait_serving

SSHD = "/usr/sbin/sshd"
SSH_KEYGEN = shutil.which("ssh-keygen") or "/usr/bin/ssh-keygen"


class SshdUnavailable(RuntimeError):
    """OpenSSH's server is not installed (Debian: ``apt-get install openssh-server``)."""


def _keygen(path: Path, passphrase: str = "") -> None:
    subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", passphrase, "-f", str(path), "-C", "trialflow-test"],
                   check=True, stdout=subprocess.DEVNULL)


class LoopbackSshd:
    """One sshd on 127.0.0.1:<free port>. Attributes after :meth:`start`: ``port``, ``user``,
    ``key_file`` (private user key), ``known_hosts`` (a file trusting this server's host key),
    ``host_public_key`` (``"ssh-ed25519 AAAA..."``), ``directory``."""

    def __init__(self, directory: Path | None = None, password_auth: bool = False, sftp: bool = True) -> None:
        if not os.path.exists(SSHD):
            raise SshdUnavailable(f"{SSHD} not found; install Debian's openssh-server")
        self.directory = Path(directory or tempfile.mkdtemp(prefix="trialflow-sshd-"))
        self._owns_directory = directory is None
        self.password_auth = password_auth
        self.sftp = sftp  # False: no sftp subsystem, as on hosts where it was disabled
        self.user = getpass.getuser()
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def key_file(self) -> Path:
        return self.directory / "user_key"

    @property
    def known_hosts(self) -> Path:
        return self.directory / "known_hosts"

    @property
    def home(self) -> Path:
        """The sessions' home folder (their ``$HOME``, so ``~`` on the "remote machine"): the real user's
        own, and its shell start-up files, stay untouched. The login folder is still the real home."""
        return self.directory / "home"

    @property
    def host_public_key(self) -> str:
        return " ".join((self.directory / "host_key.pub").read_text().split()[:2])

    def start(self, port: int | None = None, timeout: float = 20.0) -> LoopbackSshd:
        """Listen on ``port``, else on the port of the last start, else on a free one (another one when
        that is taken meanwhile); raises RuntimeError when sshd exits or does not answer in time, having
        stopped it and removed the directory it made (a directory it was given stays)."""
        d = self.directory
        d.mkdir(parents=True, exist_ok=True)
        if not (d / "host_key").exists():
            _keygen(d / "host_key")
            _keygen(self.key_file)
            shutil.copy(d / "user_key.pub", d / "authorized_keys")
        self.home.mkdir(mode=0o700, exist_ok=True)
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # privilege separation directory
        try:
            if port or self.port:
                return self._start_on(port or self.port, timeout)
            return on_a_free_port(lambda free: self._start_on(free, timeout))
        except RuntimeError:
            self.stop()
            raise

    def _start_on(self, port: int, timeout: float) -> LoopbackSshd:
        d = self.directory
        self.port = port
        self.known_hosts.write_text(f"[127.0.0.1]:{port} {self.host_public_key}\n")
        (d / "sshd_config").write_text("\n".join([
            "ListenAddress 127.0.0.1", f"Port {port}", f"HostKey {d / 'host_key'}",
            f"PidFile {d / 'sshd.pid'}", f"AuthorizedKeysFile {d / 'authorized_keys'}",
            f"AllowUsers {self.user}", "PermitRootLogin yes", "StrictModes no", "UsePAM no",
            "PubkeyAuthentication yes", f"PasswordAuthentication {'yes' if self.password_auth else 'no'}",
            "KbdInteractiveAuthentication no", "Subsystem sftp internal-sftp" if self.sftp else "", "MaxSessions 100",
            "MaxStartups 100:30:200", "ClientAliveInterval 0", "LogLevel ERROR", f'SetEnv "HOME={self.home}"', "",
        ]))
        with open(d / "sshd.log", "wb") as log:  # a killed test run leaves no listener behind
            self.proc = popen_watched([SSHD, "-D", "-e", "-f", str(d / "sshd_config")], stdout=subprocess.DEVNULL,
                                      stderr=log)
        try:
            wait_serving(self._answers, self.proc, d / "sshd.log", "sshd", timeout, poll=0.05)
        except RuntimeError:
            self.stop(remove=False)
            raise
        return self

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                return s.recv(4).startswith(b"SSH-")
        except OSError:
            return False

    def stop(self, remove: bool = True) -> None:
        """Stop the listener (sessions already open end with their clients); optionally remove files."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if remove and self._owns_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def drop_connections(self) -> int:
        """Kill this server's per-connection sshd processes (what a network cut looks like to the
        client); processes started by those sessions in their own session keep running. Returns
        the number of processes killed."""
        if self.proc is None:
            return 0
        children: dict[int, list[int]] = {}
        comms: dict[int, str] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                    head, rest = f.read().rsplit(")", 1)
                comms[int(entry)] = head.split("(", 1)[1]
                children.setdefault(int(rest.split()[1]), []).append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
        victims, todo = [], list(children.get(self.proc.pid, []))
        while todo:
            pid = todo.pop()
            if comms.get(pid) == "sshd":
                victims.append(pid)
                todo.extend(children.get(pid, []))
        for pid in victims:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        return len(victims)

    def restart(self) -> None:
        """Stop and start again on the same port with the same keys."""
        self.stop(remove=False)
        self.start(self.port)

    def __enter__(self) -> LoopbackSshd:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
