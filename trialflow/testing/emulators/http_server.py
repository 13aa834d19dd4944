"""The HTTP side every platform emulator shares: a threaded server on 127.0.0.1 (plain HTTP, or TLS
with a self-signed certificate made for the run), a request log and fault knobs.

A platform emulator subclasses :class:`EmulatorServer` and implements :meth:`EmulatorServer.respond`
(one request in, status and payload out) and :meth:`EmulatorServer.fault_body` (what its server
answers when it fails). Fault knobs: :meth:`~FaultKnobs.fail_next` (an HTTP error on the next
calls), :meth:`~FaultKnobs.drop_next` (close the connection without an answer, before or after the
request took effect), ``latency`` (seconds before each answer); :meth:`~FaultKnobs.clear_faults`
withdraws what no request has met yet.

Lifecycle: ``start()`` binds a free loopback port and serves from a daemon thread (so the server also
ends with the test process), and runs :meth:`EmulatorServer.tick` (the emulated platform's launcher:
start, reap and stop jobs) every ``tick_seconds`` from another; ``stop()`` or leaving the ``with``
block shuts both down and calls :meth:`EmulatorServer.on_stop` (the emulators kill their job
processes there).
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import random
import re
import ssl
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit


@dataclass
class Fault:
    count: int
    status: int | None  # None: drop the connection
    method: str | None
    after: bool  # drop only once the request took effect
    path: str | None  # a regular expression the request path must contain
    retry_after: int | None = None  # seconds, sent as Retry-After (throttling)


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: Any
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


class FaultKnobs:
    def __init__(self) -> None:
        self.latency = 0.0
        self._faults: list[Fault] = []
        self._fault_lock = threading.Lock()
        self._storm: tuple[float, random.Random] | None = None
        self.storm_hits = 0

    def storm(self, rate: float, seed: int = 0) -> None:
        """From now on, fail each request with probability ``rate``: 429 with Retry-After, 503, or
        (for a POST) a connection dropped after the request took effect; ``rate=0`` ends the storm."""
        with self._fault_lock:
            self._storm = (rate, random.Random(seed)) if rate else None

    def fail_next(self, count: int, status: int = 503, method: str | None = None, path: str | None = None,
                  retry_after: int | None = None) -> None:
        """Answer the next ``count`` requests (of ``method`` and ``path``, if given) with ``status``
        (and ``Retry-After: <retry_after>``, as a throttling server does)."""
        with self._fault_lock:
            self._faults.append(Fault(count, status, method, False, path, retry_after))

    def drop_next(self, count: int, method: str | None = None, after: bool = False, path: str | None = None) -> None:
        """Close the connection of the next ``count`` requests without an answer; ``after``: only
        once the request took effect (a create that happened although the client saw an error)."""
        with self._fault_lock:
            self._faults.append(Fault(count, None, method, after, path))

    def clear_faults(self) -> None:
        """Withdraw the faults no request has met yet, and end a storm: the next requests are answered."""
        with self._fault_lock:
            self._faults.clear()
            self._storm = None

    def take_fault(self, method: str, path: str) -> Fault | None:
        with self._fault_lock:
            for fault in self._faults:
                if (fault.count > 0 and fault.method in (None, method)
                        and (fault.path is None or re.search(fault.path, path))):
                    fault.count -= 1
                    return fault
            if self._storm is not None and self._storm[1].random() < self._storm[0]:
                self.storm_hits += 1
                kind = self._storm[1].choice(["throttle", "unavailable", "drop-after"])
                if kind == "throttle":
                    return Fault(0, 429, None, False, None, 1)
                if kind == "drop-after" and method == "POST":
                    return Fault(0, None, None, True, None)
                return Fault(0, 503, None, False, None)
            return None


def self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost, and its key (PEM files in ``directory``)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "trialflow emulator")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / "emulator-cert.pem", directory / "emulator-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)
    return cert_path, key_path


class EmulatorServer(FaultKnobs, ABC):
    """See the module docstring. ``tls_dir``: serve HTTPS with a self-signed certificate written
    there (its path is ``certificate``, for clients to trust)."""

    name = "emulator"
    tick_seconds = 0.02

    def __init__(self, tls_dir: Path | None = None) -> None:
        super().__init__()
        self.requests: list[tuple[str, str]] = []
        self.certificate: Path | None = None
        self._tls_dir = tls_dir
        self._server: ThreadingHTTPServer | None = None
        self._stopping = threading.Event()
        self._ticker: threading.Thread | None = None

    @abstractmethod
    def respond(self, request: Request) -> tuple[int, Any]:
        """One request: the HTTP status and the payload (a str is sent as text, bytes as they are,
        anything else as JSON)."""

    def fault_body(self, status: int) -> Any:
        return {"message": "injected fault: the server is currently unable to handle the request"}

    def tick(self) -> None:
        """One step of the emulated platform (default: none)."""

    def on_stop(self) -> None:
        """Called by :meth:`stop` after the server and the ticks stopped."""

    def _tick_forever(self) -> None:
        while not self._stopping.wait(self.tick_seconds):
            self.tick()

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self) -> Any:
        handler = type(f"{type(self).__name__}Handler", (_Handler,), {"emulator": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        if self._tls_dir is not None:
            self.certificate, key = self_signed_certificate(self._tls_dir)
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(self.certificate, key)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        # stop() waits for the loop to see the request: at most one poll interval (the default is 0.5 s)
        threading.Thread(target=self._server.serve_forever, args=(0.05,), name=self.name, daemon=True).start()
        if type(self).tick is not EmulatorServer.tick:
            self._ticker = threading.Thread(target=self._tick_forever, name=f"{self.name}-ticks", daemon=True)
            self._ticker.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self._stopping.set()
        if self._ticker is not None:
            self._ticker.join(5)
        self.on_stop()

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None, "start() the emulator first"
        scheme = "https" if self.certificate is not None else "http"
        return f"{scheme}://127.0.0.1:{self._server.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms delayed-ACK stall
    emulator: EmulatorServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 -- the base class's name
        pass

    def _serve(self) -> None:
        emulator = self.emulator
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        emulator.requests.append((self.command, self.path))
        if emulator.latency:
            time.sleep(emulator.latency)
        fault = emulator.take_fault(self.command, parts.path)
        if fault is not None and fault.status is None and not fault.after:
            self._drop()
            return
        if fault is not None and fault.status is not None:
            extra = {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else {}
            self._reply(fault.status, emulator.fault_body(fault.status), extra)
            return
        code, payload = emulator.respond(Request(self.command, parts.path, parse_qs(parts.query), self.headers, raw))
        if fault is not None:  # dropped after acting
            self._drop()
            return
        self._reply(code, payload)

    def _drop(self) -> None:
        self.close_connection = True
        try:
            self.connection.shutdown(2)
        except OSError:
            pass

    def _reply(self, code: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        if isinstance(payload, bytes):
            data, ctype = payload, "application/octet-stream"
        elif isinstance(payload, str):
            data, ctype = payload.encode(), "text/plain"
        else:
            data, ctype = json.dumps(payload).encode(), "application/json"
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve  # noqa: N815 -- http.server's names
