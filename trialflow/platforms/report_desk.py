"""The report desk: where a running trial, right after an intermediate result, asks whether the
experiment's assessor stops it, so the decision is made at report time instead of at the trial's
next poll (the trial's end is ``trialflow.trial.verdicts``, which states the protocol).

Two ways in: local trials hold a connection to a Unix stream socket (one line each way per ask);
trials of job platforms with the HTTP metric channel ask the metrics receiver
(``GET /verdict/<trial id>``, the trial's token), which hands the ask over with :meth:`ask` and waits
for its answer.

Lifecycle: a :class:`ReportDesk` is bookkeeping only until a platform whose trials connect to it asks
for its Unix socket (:meth:`ReportDesk.listen`): that binds it in a new folder of the temporary
directory that only this user can enter (``mkdtemp``: 0700) and serves it from one daemon thread.
:meth:`ReportDesk.close` stops the thread, closes every connection, answers no pending ask and removes
the socket and its folder (only what it made). Trials started by an earlier controller name a desk
that is gone: they never ask (a report costs them nothing more).

Guarantees: a trial's ask (and, over HTTP, each batch of its results) wakes its follower at once
(:meth:`wait`); the follower answers an ask only after the result was read from the trial's channel
and judged (:meth:`answer`), so the desk carries no result and nothing it is told is trusted beyond
waking a follower: a line naming a trial the experiment does not follow, or not in the protocol's
form, closes that connection. Who may reach it: processes of this user (the folder's mode), and over
HTTP whoever holds the trial's token; see docs/security.md.
"""

from __future__ import annotations

import logging
import os
import selectors
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from ..foundation.readable import Wakeup

log = logging.getLogger("trialflow.report_desk")
MAX_LINE = 256


Verdict = tuple[str, int | None]  # ("go", the next result to ask at or None) or ("stop", None)


def _covered(answered: tuple[int, Verdict] | None, sequence: int) -> Verdict | None:
    """The last answer ``answered`` (through, verdict) when it covers an ask about result ``sequence``:
    a stop covers every ask, a go those up to the result it judged."""
    if answered is not None and (answered[1][0] == "stop" or sequence <= answered[0]):
        return answered[1]
    return None


def _line(sequence: int, verdict: Verdict) -> str:
    """The desk's answer to a trial's ask on its socket: ``<sequence> stop`` or ``<sequence> go <next|->``."""
    word = "stop" if verdict[0] == "stop" else f"go {'-' if verdict[1] is None else verdict[1]}"
    return f"{sequence} {word}\n"


@dataclass
class _HttpAsk:
    sequence: int
    done: threading.Event = field(default_factory=threading.Event)
    verdict: Verdict | None = None


@dataclass
class _Asking:
    """One followed trial: its connection (once it asked), the results it waits on, its HTTP asks."""

    woken: Wakeup = field(default_factory=Wakeup)
    conn: socket.socket | None = None
    waiting: list[int] = field(default_factory=list)  # sequences asked about on ``conn``, not answered yet
    remote: bool = False  # it asks over HTTP: its follower waits on ``woken``
    http_asks: list[_HttpAsk] = field(default_factory=list)
    # the last answer (through, verdict): an ask it covers gets it at once (an HTTP ask made again after
    # its hold ended just before the answer came; an ask whose result a poll judged before it arrived)
    answered: tuple[int, Verdict] | None = None


class ReportDesk:
    """See the module. Thread-safe: one serving thread, any number of followers."""

    def __init__(self) -> None:
        self.path: str | None = None  # the Unix socket, once :meth:`listen` made it
        self._trials: dict[str, _Asking] = {}
        self._buffers: dict[socket.socket, bytes] = {}
        self._owners: dict[socket.socket, str] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._listener: _Listener | None = None

    def listen(self) -> str:
        """Serve the Unix socket (made at the first call) from one daemon thread; returns its path.
        Raises OSError when no socket can be made here, or the desk is closed."""
        with self._lock:
            if self._closed:
                raise OSError("the report desk is closed")
            if self._listener is None:
                self._listener = _Listener(self._serve)
                self.path = self._listener.path
            return self._listener.path

    def close(self) -> None:
        """Stop serving; trials waiting on an answer see the desk closed and carry on. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for asking in self._trials.values():  # HTTP asks are answered "no word"
                for ask in asking.http_asks:
                    ask.done.set()
                asking.woken.set()  # a follower waiting on its wakeup goes on
        if self._listener is not None:
            self._listener.stop()
            for conn in list(self._buffers):
                conn.close()
            self._listener.remove()
        with self._lock:
            trials, self._trials = self._trials, {}
        for asking in trials.values():
            asking.woken.close()

    # ---- the followers' side ------------------------------------------------------------

    def follow(self, trial_id: str) -> None:
        """Accept asks from trial ``trial_id`` (until :meth:`forget`)."""
        with self._lock:
            if trial_id not in self._trials and not self._closed:
                self._trials[trial_id] = _Asking()

    def forget(self, trial_id: str) -> None:
        """The trial ended: its connection, if any, is closed."""
        with self._lock:
            asking = self._trials.pop(trial_id, None)
            for ask in asking.http_asks if asking is not None else []:
                ask.done.set()
        if asking is not None:
            if asking.conn is not None:
                self._drop(asking.conn)
            asking.woken.close()

    def wait(self, trial_id: str, timeout: float) -> bool:
        """For a trial that asks over HTTP: block up to ``timeout`` or until it asks or its results
        arrive. False at once (nothing waited) for any other trial: its service's wait watches
        :meth:`wakeup_fd` beside its own events."""
        with self._lock:
            asking = self._trials.get(trial_id)
            if asking is None or not asking.remote:
                return False
        asking.woken.wait(timeout)
        asking.woken.clear()
        return True

    def wakeup_fd(self, trial_id: str) -> int | None:
        """A descriptor readable once trial ``trial_id`` asked or its connection ended (None when the
        trial is not followed); :meth:`clear_wakeup` after reading it."""
        with self._lock:
            asking = self._trials.get(trial_id)
        return asking.woken.fd if asking is not None else None

    def clear_wakeup(self, trial_id: str) -> None:
        with self._lock:
            asking = self._trials.get(trial_id)
        if asking is not None:
            asking.woken.clear()

    def wake(self, trial_id: str) -> None:
        """New results of the trial arrived (the metrics receiver): its follower reads them now."""
        with self._lock:
            asking = self._trials.get(trial_id)
        if asking is not None:
            asking.woken.set()

    def ask(self, trial_id: str, sequence: int, timeout: float) -> Verdict | None:
        """An ask over HTTP (the metrics receiver's thread, the trial's token checked): wakes the
        trial's follower and waits up to ``timeout`` for its answer; an ask the last answer covers (a
        stop, or a sequence up to the one it judged) gets that answer at once. None when the trial is
        not followed, the answer did not come in time, or the desk closed."""
        ask = _HttpAsk(sequence)
        with self._lock:
            asking = self._trials.get(trial_id)
            if asking is None or self._closed:
                return None
            asking.remote = True
            covered = _covered(asking.answered, sequence)
            if covered is not None:
                return covered
            asking.http_asks.append(ask)
            asking.woken.set()
        ask.done.wait(timeout)
        with self._lock:
            if ask in asking.http_asks:
                asking.http_asks.remove(ask)
        return ask.verdict

    def answer(self, trial_id: str, through: int, stop: bool, next_ask: int | None = None) -> None:
        """Answer the trial's asks about results up to sequence ``through`` (judged by now): ``stop``
        (every ask), or go on and ask again at result ``next_ask`` (None: never again)."""
        verdict: Verdict = ("stop", None) if stop else ("go", next_ask)
        with self._lock:
            asking = self._trials.get(trial_id)
            if asking is None:
                return
            if asking.answered is None or asking.answered[1][0] != "stop":
                asking.answered = (through, verdict)
            for ask in [a for a in asking.http_asks if _covered((through, verdict), a.sequence)]:
                asking.http_asks.remove(ask)
                ask.verdict = verdict
                ask.done.set()
            if asking.conn is None or not asking.waiting:
                return
            due = [s for s in asking.waiting if s <= through]
            if not due and not stop:
                return
            asking.waiting = [s for s in asking.waiting if s > through]
            conn = asking.conn
        lines = "".join(_line(s, verdict) for s in (due or [through]))
        try:
            conn.sendall(lines.encode())
        except OSError:  # the trial ended meanwhile
            self._drop(conn)

    # ---- the serving thread --------------------------------------------------------------

    def _serve(self, listener: _Listener) -> None:
        while not self._closed:
            for key, _ in listener.selector.select():
                sock = key.fileobj
                if sock is listener.wake_r:
                    return
                if sock is listener.server:
                    self._accept(listener)
                else:
                    self._read(sock)  # type: ignore[arg-type]

    def _accept(self, listener: _Listener) -> None:
        try:
            conn, _ = listener.server.accept()
        except OSError:
            return
        conn.setblocking(True)
        conn.settimeout(1.0)  # an answer to a trial that stopped reading is dropped, not waited on
        with self._lock:
            self._buffers[conn] = b""
        listener.selector.register(conn, selectors.EVENT_READ)

    def _read(self, conn: socket.socket) -> None:
        try:
            chunk = conn.recv(4096)
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(conn)
            return
        data = self._buffers.get(conn, b"") + chunk
        *lines, rest = data.split(b"\n")
        if len(rest) > MAX_LINE:
            self._drop(conn, "a line too long")
            return
        self._buffers[conn] = rest
        for line in lines:
            if not self._note(conn, line):
                return

    def _note(self, conn: socket.socket, line: bytes) -> bool:
        """One ask ``<trial id> <sequence>``: answered at once when the trial's last answer covers it,
        else the trial's follower is woken. False (connection closed)
        when it names no trial the desk follows, another trial than the connection's first ask, or
        is not in that form."""
        words = line.decode("ascii", "replace").split()
        if len(words) != 2 or not words[1].isdigit():
            self._drop(conn, "a line not in the desk's form")
            return False
        trial_id, sequence = words[0], int(words[1])
        allowed, covered = False, None
        with self._lock:
            asking = self._trials.get(trial_id)
            owner = self._owners.setdefault(conn, trial_id)
            if asking is not None and owner == trial_id and (asking.conn is None or asking.conn is conn):
                allowed = True
                asking.conn = conn
                covered = _covered(asking.answered, sequence)
                if covered is None:  # the follower judges it
                    asking.waiting.append(sequence)
                    asking.woken.set()
        if not allowed:
            self._drop(conn, f"an ask for trial {trial_id!r}, which this connection may not make")
            return False
        if covered is not None:
            try:
                conn.sendall(_line(sequence, covered).encode())
            except OSError:  # the trial ended meanwhile
                self._drop(conn)
                return False
        return True

    def _drop(self, conn: socket.socket, problem: str | None = None) -> None:
        if problem is not None:
            log.warning("report desk: a connection sent %s; it is closed", problem)
        with self._lock:
            self._buffers.pop(conn, None)
            owner = self._owners.pop(conn, None)
            asking = self._trials.get(owner) if owner is not None else None
            if asking is not None and asking.conn is conn:
                asking.conn = None
                asking.waiting.clear()
                asking.woken.set()
        if self._listener is not None:
            try:
                self._listener.selector.unregister(conn)
            except (KeyError, ValueError):
                pass
        conn.close()


class _Listener:
    """The desk's Unix socket, in a new 0700 folder, and the thread serving it (``serve(listener)``)."""

    def __init__(self, serve: Callable[[_Listener], None]) -> None:
        self.folder = tempfile.mkdtemp(prefix="trialflow-desk-")
        self.path = os.path.join(self.folder, "desk.sock")
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.server.bind(self.path)
            self.server.listen(128)
            self.server.setblocking(False)
        except OSError:
            self.server.close()
            shutil.rmtree(self.folder, ignore_errors=True)
            raise
        self.selector = selectors.DefaultSelector()
        self.wake_r, self.wake_w = socket.socketpair()
        self.selector.register(self.server, selectors.EVENT_READ)
        self.selector.register(self.wake_r, selectors.EVENT_READ)
        self.thread = threading.Thread(target=serve, args=(self,), name="trialflow-report-desk", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """End the serving thread (its loop sees the desk closed)."""
        self.wake_w.send(b"x")
        self.thread.join(timeout=5)

    def remove(self) -> None:
        """Close the socket and remove its folder (after :meth:`stop`)."""
        for sock in (self.server, self.wake_r, self.wake_w):
            sock.close()
        self.selector.close()
        shutil.rmtree(self.folder, ignore_errors=True)
