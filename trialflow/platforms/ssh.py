"""One pooled SSH connection per remote machine (paramiko), re-established after a drop.

Lifecycle: created per machine by the remote service; the first call connects; every call
(``run``, ``run_streaming``, ``sftp_call``) reconnects once when the connection was lost and
raises :class:`TransientPlatformError` when the machine stays unreachable, so callers retry
later while trials keep running on the worker. Host keys are checked against ``known_hosts``
(plus ``/etc/ssh/ssh_known_hosts``); unknown hosts are refused unless trust on first use was
asked for, in which case the key is added to the file. Authentication and host-key problems are
permanent :class:`PlatformError` s whose messages name the fix; secrets never appear in them.
"""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import paramiko
from pydantic import SecretStr

from ..blocks import BlockNotFoundError, SSHCredentials, load_block
from ..config.sections.remote import RemoteMachineConfig
from .base import PlatformError, TransientPlatformError

T = TypeVar("T")
CONNECT_TIMEOUT = 15.0
KEEPALIVE_SECONDS = 15
SYSTEM_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"
# AES-GCM first: the fastest cipher paramiko speaks (about 1.5x aes-ctr for uploads).
_FAST_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
_CONNECTION_ERRORS = (paramiko.SSHException, EOFError, OSError)


class SftpRefused(Exception):
    """The server did not open the SFTP subsystem on a live connection: no SFTP on that host, or the
    connection's server side died while it opened (told apart by a second connection)."""


@dataclass(frozen=True)
class SshTarget:
    """Where and as whom to log in. Exactly one of password, key_file, key_data is normally set."""

    host: str
    port: int
    user: str
    password: SecretStr | None = None
    key_file: Path | None = None
    key_data: SecretStr | None = None
    passphrase: SecretStr | None = None

    @property
    def label(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"

    def known_hosts_name(self) -> str:
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"


class SshConnection:
    def __init__(self, target: SshTarget, known_hosts: Path, trust_unknown_hosts: bool = False,
                 connect_timeout: float = CONNECT_TIMEOUT) -> None:
        self.target = target
        self.known_hosts = known_hosts
        self.trust_unknown_hosts = trust_unknown_hosts
        self.connect_timeout = connect_timeout
        self._client: paramiko.SSHClient | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._lock = threading.RLock()  # guards the client and serialises SFTP requests
        self.reconnects = 0  # connections re-established after a loss
        self._authenticated_once = False

    # ---- connecting -----------------------------------------------------------------------

    def _transport(self, sock: Any, **kwargs: Any) -> paramiko.Transport:
        transport = paramiko.Transport(sock, **kwargs)
        options = transport.get_security_options()
        options.ciphers = _FAST_CIPHERS + tuple(c for c in options.ciphers if c not in _FAST_CIPHERS)
        return transport

    def _new_client(self) -> paramiko.SSHClient:
        t = self.target
        client = paramiko.SSHClient()
        if os.path.isfile(SYSTEM_KNOWN_HOSTS):
            client.load_system_host_keys(SYSTEM_KNOWN_HOSTS)
        if self.trust_unknown_hosts:
            self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
            self.known_hosts.touch(exist_ok=True)
            client.set_missing_host_key_policy(paramiko.AutoAddPolicy())  # saves new keys to known_hosts
        else:
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
        if self.known_hosts.is_file():
            client.load_host_keys(str(self.known_hosts))
        auth: dict[str, Any] = {"look_for_keys": False, "allow_agent": False}
        if t.password is not None:
            auth["password"] = t.password.get_secret_value()
        elif t.key_data is not None:
            auth["pkey"] = self._load_key_data(t.key_data, t.passphrase)
        elif t.key_file is not None:
            if not t.key_file.is_file():
                raise PlatformError(f"{t.label}: sshKeyFile {t.key_file} does not exist; give the path of the "
                                    "private key that the machine's authorized_keys accepts")
            auth["key_filename"] = str(t.key_file)
            if t.passphrase is not None:
                auth["passphrase"] = t.passphrase.get_secret_value()
        try:
            client.connect(t.host, t.port, t.user, timeout=self.connect_timeout, banner_timeout=self.connect_timeout,
                           auth_timeout=self.connect_timeout, transport_factory=self._transport, **auth)
        except paramiko.BadHostKeyException:
            client.close()
            raise PlatformError(
                f"{t.label}: the SSH host key differs from the one recorded in {self.known_hosts} -- possibly a "
                f"man-in-the-middle attack. If the server was reinstalled, remove the old key with "
                f"`ssh-keygen -R '{t.known_hosts_name()}' -f {self.known_hosts}` and verify the new one") from None
        except paramiko.PasswordRequiredException:
            client.close()
            raise PlatformError(f"{t.label}: the private key is encrypted; set sshPassphrase (or the credentials "
                                "block's passphrase)") from None
        except paramiko.AuthenticationException:
            client.close()
            method = "password" if t.password is not None else "private key"
            if self._authenticated_once:
                # These credentials logged in before: a server dropping its sessions (restart, overload)
                # answers a login in progress like a refusal. Retried; a real change fails after retries.
                raise TransientPlatformError(f"{t.label}: SSH authentication with the {method} failed on "
                                             "reconnecting, although it worked before; retrying") from None
            raise PlatformError(f"{t.label}: SSH authentication failed with the {method}; check user, "
                                "password / sshKeyFile / sshPassphrase (or the credentials block) and the "
                                "machine's authorized_keys") from None
        except paramiko.SSHException as exc:
            client.close()
            text = str(exc)
            if "not found in known_hosts" in text:
                raise PlatformError(
                    f"{t.label}: unknown SSH host key ({t.known_hosts_name()} is not in {self.known_hosts}). Verify "
                    f"the server's key and add it with `ssh-keyscan -p {t.port} {t.host} >> {self.known_hosts}`, "
                    "or set trustUnknownHosts: true in trainingService to accept it on first use") from None
            if "private key" in text.lower() or "not a valid" in text.lower():
                raise PlatformError(f"{t.label}: cannot read the private key: {text}") from None
            raise TransientPlatformError(f"{t.label}: SSH connection failed: {text}") from None
        except (OSError, EOFError) as exc:
            client.close()
            raise TransientPlatformError(f"{t.label}: cannot connect: {exc}") from None
        transport = client.get_transport()
        assert transport is not None
        transport.set_keepalive(KEEPALIVE_SECONDS)
        self._authenticated_once = True
        return client

    @staticmethod
    def _load_key_data(data: SecretStr, passphrase: SecretStr | None) -> paramiko.PKey:
        text = data.get_secret_value()
        password = passphrase.get_secret_value() if passphrase else None
        for kind in (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey):
            try:
                return kind.from_private_key(io.StringIO(text), password=password)
            except paramiko.PasswordRequiredException:
                raise PlatformError("the private key in the credentials block is encrypted; "
                                    "set its passphrase") from None
            except paramiko.SSHException:
                continue
        raise PlatformError("the private key in the credentials block is not an Ed25519, ECDSA or RSA key")

    def client(self) -> paramiko.SSHClient:
        with self._lock:
            transport = self._client.get_transport() if self._client else None
            if transport is None or not transport.is_active():
                lost = self._client is not None
                self._drop()
                self._client = None
                self._client = self._new_client()
                self.reconnects += lost
            return self._client  # type: ignore[return-value]

    def _drop(self) -> None:
        with self._lock:
            for closable in (self._sftp, self._client):
                if closable is not None:
                    try:
                        closable.close()
                    except Exception:  # noqa: BLE001 -- closing a dead connection may fail any way
                        pass
            self._sftp = None

    def close(self) -> None:
        with self._lock:
            self._drop()
            self._client = None

    def _retrying(self, what: str, call: Callable[[paramiko.SSHClient], T]) -> T:
        """Run ``call`` with a live client; after a connection error reconnect and try once more.
        An SFTP subsystem refused on both connections means the host has none (a connection dying
        while SFTP opens looks the same once; a second, fresh connection tells them apart)."""
        last: BaseException | None = None
        for attempt in range(2):
            client = self.client()
            try:
                return call(client)
            except SftpRefused as exc:
                if attempt == 1:
                    raise PlatformError(str(exc)) from None
                last = exc
                self._drop()
            except PlatformError:
                raise
            except _CONNECTION_ERRORS as exc:
                transport = client.get_transport()
                alive = transport is not None and transport.is_active()
                if alive and isinstance(exc, OSError) and exc.errno is not None and not isinstance(exc, TimeoutError):
                    raise  # an SFTP answer (no such file, permission denied), not a lost connection
                last = exc
                self._drop()  # the next client() call reconnects (and counts it)
        raise TransientPlatformError(f"{self.target.label}: {what} failed, connection lost: {last}")

    # ---- commands -------------------------------------------------------------------------

    def run(self, command: str, stdin: bytes | None = None, timeout: float = 120.0) -> tuple[int, str, str]:
        """Run ``command`` through the login shell; returns (exit status, stdout, stderr)."""
        return self.run_streaming(command, (lambda send: send(stdin)) if stdin is not None else None, timeout)[1:]

    def run_streaming(self, command: str, feed: Callable[[Callable[[bytes], None]], Any] | None,
                      timeout: float = 600.0) -> tuple[Any, int, str, str]:
        """Run ``command`` with ``feed(send)`` writing its stdin; returns (feed's result, status, out, err).
        A session lost before the exit status arrived counts as a lost connection: the command runs
        again once on a new connection (every command trialflow runs this way is idempotent)."""

        def call(client: paramiko.SSHClient) -> tuple[Any, int, str, str]:
            transport = client.get_transport()
            assert transport is not None
            channel = transport.open_session(timeout=self.connect_timeout)
            try:
                channel.settimeout(timeout)
                channel.exec_command(command)
                result = feed(channel.sendall) if feed is not None else None
                channel.shutdown_write()
                out = _read_all(channel.makefile("rb"))
                err = _read_all(channel.makefile_stderr("rb"))
                status = channel.recv_exit_status()
                if status == -1:  # the session ended without an exit status: the connection was lost
                    raise EOFError("the SSH session closed before the command's exit status arrived")
                return result, status, out, err
            finally:
                channel.close()

        return self._retrying("running a command", call)

    def sftp_call(self, what: str, call: Callable[[paramiko.SFTPClient], T]) -> T:
        """Run ``call`` with the machine's SFTP session (one at a time)."""

        def with_sftp(client: paramiko.SSHClient) -> T:
            with self._lock:
                if self._sftp is None:
                    self._sftp = self._open_sftp(client)
                return call(self._sftp)

        return self._retrying(what, with_sftp)

    def _open_sftp(self, client: paramiko.SSHClient) -> paramiko.SFTPClient:
        try:
            sftp = client.open_sftp()
        except (paramiko.SSHException, EOFError):
            transport = client.get_transport()
            if transport is not None and transport.is_active():  # logged in, but the subsystem was refused
                raise SftpRefused(
                    f"{self.target.label}: SFTP is not available on this host (sshd refused the sftp subsystem); "
                    "trialflow copies code and reads trial files over SFTP: enable it in /etc/ssh/sshd_config "
                    "with 'Subsystem sftp internal-sftp' (or the sftp-server path) and reload sshd") from None
            raise
        sftp.get_channel().settimeout(60.0)  # type: ignore[union-attr]
        return sftp


def _read_all(stream: Any) -> str:
    data: bytes = stream.read()
    return data.decode("utf-8", "replace")


def machine_target(machine: RemoteMachineConfig) -> SshTarget:
    """The login of a ``machineList`` entry: its credentials block, or its inline fields."""
    if machine.credentials:
        return _target_from_block(machine.credentials, machine.host, machine.port, machine.user)
    assert machine.user is not None
    return SshTarget(machine.host, machine.port, machine.user, machine.password, machine.ssh_key_file, None,
                     machine.ssh_passphrase)


def _target_from_block(name: str, host: str, port: int, user: str | None = None) -> SshTarget:
    """The login for ``host:port`` from the saved :class:`SSHCredentials` block ``name``."""
    try:
        block = load_block(SSHCredentials, name)
    except BlockNotFoundError as exc:
        raise PlatformError(str(exc)) from None
    if block.password is None and block.private_key is None and not block.private_key_file:
        raise PlatformError(f"SSH credentials block {name!r} for {host}: set a password, private_key or "
                            "private_key_file")
    key_file = Path(block.private_key_file).expanduser() if block.private_key_file else None
    return SshTarget(host, port, user or block.username, block.password, key_file, block.private_key,
                     block.passphrase)
