"""The metrics receiver: the HTTP endpoint trials push metrics to when no file of theirs is reachable.

One receiver per experiment controller, started by the services that need it and stopped by their
``close()``. It binds 127.0.0.1 unless ``nniManagerIp`` names the address pods reach this machine at.

``POST /metrics/<trial id>`` with ``Authorization: Bearer <token>`` and a JSON body
``{"metrics": [<record>, ...]}``, each record NNI's metric JSON (as a string or an object). Answers:

* 200 ``{"accepted": n, "duplicates": d}`` -- records are idempotent by (type, sequence), so a
  retried batch is harmless;
* 401 without a known token; 403 when the token is not allowed to write that trial (a trial token
  allows its own trial; an environment token the trials currently assigned to its environment);
  410 once the trial's end is recorded (:meth:`forget` revokes every grant of it and buffers nothing);
* 411 without a Content-Length, 413 over ``max_body`` bytes, 400 for a body that is not JSON (NaN
  and Infinity literals included) or not of that shape, 422 when a record is invalid (then nothing of
  the batch is kept), 429 with ``Retry-After`` when a token goes over its request rate or its
  trial's unread backlog is full (``MAX_BACKLOG`` records or ``MAX_BACKLOG_BYTES``); 404/405 for other
  paths and methods.

``GET /verdict/<trial id>?sequence=<n>`` (the same token, counted in the same rate), served once a
report desk is attached (:meth:`attach_desk`; 404 before): the trial's ask whether the assessor
stops it after its result ``n`` (``trialflow.platforms.report_desk``), answered when the follower
has judged it or after ``VERDICT_WAIT`` seconds: 200 ``{"verdict": "go", "next": <n or null>}``,
``{"verdict": "stop"}`` or ``{"verdict": null}`` (no word in time). Each accepted batch wakes the
trial's follower at the desk.

Slow or idle clients are cut after ``CLIENT_TIMEOUT`` seconds; at most ``MAX_CONNECTIONS`` are served
at once (both settable per receiver; a connection beyond is closed at once). A refused or broken
request is logged as one line, at most one every ``LOG_EVERY`` seconds (with how many were not logged).

Accepted records wait in memory until the service's ``poll()`` takes them with :meth:`drain`.
Tokens are kept only as SHA-256 digests (looked up by digest, so no comparison leaks a prefix) and
never logged.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ..trial.records import MetricRecord, MetricRecordError, parse_record
from .report_desk import ReportDesk

MAX_BODY_BYTES = 1024 * 1024
RATE_PER_SECOND = 500.0
BURST = 1000.0
MAX_BACKLOG = 200_000
MAX_BACKLOG_BYTES = 32 * 1024 * 1024  # per trial, until its follower drains them
CLIENT_TIMEOUT = 10.0
VERDICT_WAIT = 5.0  # below the trial's own wait for an answer (trialflow.trial.verdicts)
MAX_CONNECTIONS = 64
LOG_EVERY = 10.0
log = logging.getLogger("trialflow.metrics")


@dataclass
class _Grant:
    trials: set[str]
    tokens: float = BURST
    refilled: float = field(default_factory=time.monotonic)


@dataclass
class ReceiverStats:
    accepted: int = 0
    duplicates: int = 0
    refused: dict[int, int] = field(default_factory=dict)


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "replace")).digest()


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


class MetricsReceiver:
    def __init__(self, host: str = "127.0.0.1", port: int = 0, advertise: str | None = None,
                 max_body: int = MAX_BODY_BYTES, rate: float = RATE_PER_SECOND, burst: float = BURST,
                 client_timeout: float = CLIENT_TIMEOUT, max_connections: int = MAX_CONNECTIONS,
                 max_backlog_bytes: int = MAX_BACKLOG_BYTES) -> None:
        self.bind_host, self.bind_port = host, port
        self.advertise = advertise or host
        self.max_body, self.rate, self.burst = max_body, rate, burst
        self.client_timeout, self.max_connections = client_timeout, max_connections
        self.max_backlog_bytes = max_backlog_bytes
        self.stats = ReceiverStats()
        self._grants: dict[bytes, _Grant] = {}
        self._pending: dict[str, list[MetricRecord]] = {}
        self._pending_bytes: dict[str, int] = {}
        self._seen: dict[str, set[tuple[str, int]]] = {}
        self._ended: set[str] = set()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._log_gate = _LogGate()
        self.desk: ReportDesk | None = None

    def attach_desk(self, desk: ReportDesk) -> None:
        """Serve ``GET /verdict/...`` from ``desk`` and wake its followers as results arrive."""
        self.desk = desk

    # ---- lifecycle -----------------------------------------------------------------------------

    def start(self) -> MetricsReceiver:
        receiver = self

        class Handler(_Handler):
            pass

        Handler.receiver = receiver
        Handler.timeout = self.client_timeout
        try:
            self._server = _CappedServer((self.bind_host, self.bind_port), Handler, self._log_gate,
                                         self.max_connections)
        except OSError:
            if not self.bind_port:
                raise
            self._server = _CappedServer((self.bind_host, 0), Handler, self._log_gate,  # the old port is taken
                                         self.max_connections)
        # stop() waits for the loop to see the request: at most one poll interval (the default is 0.5 s)
        threading.Thread(target=self._server.serve_forever, args=(0.05,), name="metrics-receiver", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def port(self) -> int:
        assert self._server is not None, "start() the receiver first"
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """The base URL trials push to."""
        return f"http://{self.advertise}:{self.port}"

    # ---- tokens ---------------------------------------------------------------------------------

    @staticmethod
    def new_token() -> str:
        return secrets.token_urlsafe(32)

    def grant(self, token: str, *trial_ids: str) -> None:
        """Allow ``token`` to append metrics of ``trial_ids`` (added to what it already may write)."""
        with self._lock:
            grant = self._grants.setdefault(_digest(token), _Grant(set(), self.burst))
            grant.trials.update(trial_ids)

    def revoke(self, token: str, trial_id: str | None = None) -> None:
        with self._lock:
            if trial_id is None:
                self._grants.pop(_digest(token), None)
            elif _digest(token) in self._grants:
                self._grants[_digest(token)].trials.discard(trial_id)

    # ---- records --------------------------------------------------------------------------------

    def drain(self, trial_id: str) -> list[MetricRecord]:
        """The records received for ``trial_id`` since the last drain, in arrival order."""
        with self._lock:
            self._pending_bytes.pop(trial_id, None)
            return self._pending.pop(trial_id, [])

    def forget(self, trial_id: str) -> None:
        """The trial's end is recorded: revoke every grant of it (its requests answer 410 from now on)
        and drop what it still had buffered."""
        with self._lock:
            self._ended.add(trial_id)
            for grant in self._grants.values():
                grant.trials.discard(trial_id)
            self._pending.pop(trial_id, None)
            self._pending_bytes.pop(trial_id, None)
            self._seen.pop(trial_id, None)

    def _authorize(self, header: str | None, trial_id: str) -> int:
        if not header or not header.startswith("Bearer "):
            return 401
        offered = header[7:].strip()
        with self._lock:
            grant = self._grants.get(_digest(offered))
            if grant is None:
                return 401
            if trial_id in self._ended:
                return 410
            if trial_id not in grant.trials:
                return 403
            now = time.monotonic()
            grant.tokens = min(self.burst, grant.tokens + (now - grant.refilled) * self.rate)
            grant.refilled = now
            if grant.tokens < 1 or len(self._pending.get(trial_id, ())) >= MAX_BACKLOG:
                return 429
            grant.tokens -= 1
        return 0

    def accept(self, trial_id: str, body: bytes) -> tuple[int, dict[str, Any]]:
        try:
            data = json.loads(body, parse_constant=_no_constants)
        except (ValueError, UnicodeDecodeError) as exc:
            return 400, {"error": f"the body is not valid JSON: {exc}"}
        metrics = data.get("metrics") if isinstance(data, dict) else None
        if not isinstance(metrics, list):
            return 400, {"error": 'the body must be {"metrics": [<metric record>, ...]}'}
        records = []
        size = 0
        for index, item in enumerate(metrics):
            try:
                text = item if isinstance(item, str) else json.dumps(item)
                records.append(parse_record(text, trial_id))
                size += len(text)
            except (MetricRecordError, TypeError, ValueError, RecursionError) as exc:
                return 422, {"error": f"metrics[{index}]: {exc}"}
        accepted = duplicates = 0
        with self._lock:
            if trial_id in self._ended:
                return 410, {"error": "the trial has ended"}
            if self._pending_bytes.get(trial_id, 0) + size > self.max_backlog_bytes:
                return 429, {"error": "the trial's unread metrics are over their size limit; retry later"}
            self._pending_bytes[trial_id] = self._pending_bytes.get(trial_id, 0) + size
            seen = self._seen.setdefault(trial_id, set())
            pending = self._pending.setdefault(trial_id, [])
            for record in records:
                key = (record.type, record.sequence)
                if key in seen:
                    duplicates += 1
                    continue
                seen.add(key)
                pending.append(record)
                accepted += 1
            self.stats.accepted += accepted
            self.stats.duplicates += duplicates
        if accepted and self.desk is not None:
            self.desk.wake(trial_id)
        return 200, {"accepted": accepted, "duplicates": duplicates}

    def verdict(self, trial_id: str, query: str) -> tuple[int, dict[str, Any]]:
        """The desk's answer to the trial's ask (``query``: ``sequence=<n>``)."""
        if self.desk is None:
            return 404, {"error": "no assessor answers at report time here"}
        fields = dict(part.partition("=")[::2] for part in query.split("&") if part)
        sequence = fields.get("sequence", "")
        if not sequence.isdigit() or len(sequence) > 10:
            return 400, {"error": "GET /verdict/<trial id>?sequence=<the result's sequence number>"}
        answer = self.desk.ask(trial_id, int(sequence), VERDICT_WAIT)
        if answer is None:
            return 200, {"verdict": None}
        word, next_ask = answer
        return 200, {"verdict": word, **({"next": next_ask} if word == "go" else {})}


class _LogGate:
    """One log line per ``LOG_EVERY`` seconds for refused or broken requests, counting the rest."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last = float("-inf")
        self._skipped = 0

    def warn(self, text: str) -> None:
        with self._lock:
            now = time.monotonic()
            if now - self._last < LOG_EVERY:
                self._skipped += 1
                return
            skipped, self._skipped, self._last = self._skipped, 0, now
        log.warning("metrics receiver: %s%s", text, f" ({skipped} more not logged)" if skipped else "")


class _CappedServer(ThreadingHTTPServer):
    """Serves at most ``MAX_CONNECTIONS`` connections at once (a thread each); one beyond is closed
    unanswered. Errors of a connection are one rate-limited log line, never a traceback."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], gate: _LogGate,
                 max_connections: int) -> None:
        super().__init__(address, handler)
        self.max_connections = max_connections
        self._slots = threading.BoundedSemaphore(max_connections)
        self.gate = gate

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.gate.warn(f"{self.max_connections} connections are open; refused one from {client_address[0]}")
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        self.gate.warn(f"a request from {client_address[0]} broke off ({type(exc).__name__}: {exc})")


AUTH_ERRORS = {401: "a valid bearer token is required", 403: "this token may not write metrics of this trial",
               410: "the trial has ended", 429: "too many requests; retry later"}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms delayed-ACK stall
    timeout = CLIENT_TIMEOUT  # a client that stops sending is cut off (the socket's timeout)
    receiver: MetricsReceiver

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 -- the base class's name
        pass  # request lines would carry trial ids only, but keep the receiver silent like a daemon

    def do_POST(self) -> None:  # noqa: N802 -- http.server's name
        receiver = self.receiver
        parts = self.path.split("?", 1)[0].strip("/").split("/")
        if len(parts) != 2 or parts[0] != "metrics":
            self._discard_body()
            return self._reply(404, {"error": "POST /metrics/<trial id>"})
        trial_id = parts[1]
        code = receiver._authorize(self.headers.get("Authorization"), trial_id)
        if code:
            self._discard_body()
            return self._reply(code, {"error": AUTH_ERRORS[code]})
        length_header = self.headers.get("Content-Length")
        if length_header is None or not length_header.isdigit():
            self.close_connection = True
            return self._reply(411, {"error": "a Content-Length header is required"})
        length = int(length_header)
        if length > receiver.max_body:
            self.close_connection = True
            return self._reply(413, {"error": f"the body is {length} bytes; the limit is {receiver.max_body}"})
        code, payload = receiver.accept(trial_id, self.rfile.read(length))
        self._reply(code, payload)

    def do_GET(self) -> None:  # noqa: N802
        path, _, query = self.path.partition("?")
        parts = path.strip("/").split("/")
        if len(parts) != 2 or parts[0] != "verdict":
            return self._refuse()
        code = self.receiver._authorize(self.headers.get("Authorization"), parts[1])
        if code:
            return self._reply(code, {"error": AUTH_ERRORS[code]})
        self._reply(*self.receiver.verdict(parts[1], query))

    def _refuse(self) -> None:
        self._discard_body()
        self._reply(405, {"error": "only POST /metrics/<trial id> and GET /verdict/<trial id> are served"})

    do_PUT = do_DELETE = do_PATCH = _refuse  # noqa: N815

    def _discard_body(self) -> None:
        length = self.headers.get("Content-Length")
        if length and length.isdigit() and int(length) <= self.receiver.max_body:
            self.rfile.read(int(length))
        else:
            self.close_connection = True

    def _reply(self, code: int, payload: dict[str, Any]) -> None:
        if code != 200:
            with self.receiver._lock:
                self.receiver.stats.refused[code] = self.receiver.stats.refused.get(code, 0) + 1
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if code == 429:
            self.send_header("Retry-After", "1")
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
