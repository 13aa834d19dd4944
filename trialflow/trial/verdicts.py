"""The trial's end of the report desk (``trialflow.platforms.report_desk``): after an intermediate
result at a step where the experiment's assessor may stop it, the trial asks the controller and waits
for its word, so a trial stopped at its rung takes no step past it. Standard library only (it runs in trials).

Protocol: ``TRIALFLOW_REPORT_DESK`` names the desk's Unix socket (in a folder only its user can
enter), one line each way: the trial sends ``<trial id> <sequence>`` after its result ``sequence`` is
recorded on its channel; the controller answers ``<sequence> go <next>`` (ask again at result
``next``; ``-``: never again) or ``<sequence> stop``, once the assessor has judged that result. Or it
is ``receiver``: the trial asks the metrics receiver of the HTTP channel, ``GET
<TRIALFLOW_METRICS_URL>/verdict/<trial id>?sequence=<n>`` with its token, answered as JSON
(``{"verdict": "go", "next": n}``, ``{"verdict": "stop"}``, ``{"verdict": null}`` for no word within the
few seconds the receiver holds a request: the trial asks again).

Guarantees: without the variable, or once the desk cannot be reached or has closed, a report costs nothing
more (the trial never asks again; it says why once, on stderr); a receiver that cannot be reached costs that
ask only. A desk that does not answer within :data:`VERDICT_WAIT_SECONDS` (a controller slowed by load) is not
waited on further for that result (its late answer is read at the next ask). On ``stop`` the trial takes no
further step: it waits for the controller to end it (the stop is recorded before the trial is killed), and
goes on only if it is still alive after :data:`STOPPED_WAIT_SECONDS` (the controller dropped the stop).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

from .protocol import RECEIVER_DESK, REPORT_DESK_ENV

TYPE_CHECKING = False  # typing stays unimported at run time (the trial's start)
if TYPE_CHECKING:
    from collections.abc import Callable

VERDICT_WAIT_SECONDS = 30.0  # the longest a trial waits for the word on one result
REQUEST_TIMEOUT_SECONDS = 15.0  # one ask over HTTP (the receiver answers "no word" within a few seconds)
ASK_AGAIN_SECONDS = 0.2  # the pause before asking again after an immediate "no word"
STOPPED_WAIT_SECONDS = 60.0
MAX_LINE = 256


class _Desk:
    """The trial's connection to the desk (one per process, made at the first ask)."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(VERDICT_WAIT_SECONDS)
        self.sock.connect(path)
        self.buffer = b""
        self.next_ask: int | None = 0  # the first result at which to ask; None: never again

    def ask(self, trial_id: str, sequence: int) -> str | None:
        """The desk's word on result ``sequence``: ``stop``, ``go`` (``next_ask`` updated), or None
        when it did not answer in time. Raises OSError when the desk is gone."""
        self.sock.sendall(f"{trial_id} {sequence}\n".encode())
        deadline = time.monotonic() + VERDICT_WAIT_SECONDS
        while True:
            while b"\n" not in self.buffer:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.sock.settimeout(left)
                try:
                    chunk = self.sock.recv(MAX_LINE)
                except TimeoutError:
                    return None
                if not chunk:
                    raise OSError("the report desk closed")
                self.buffer += chunk
            line, _, self.buffer = self.buffer.partition(b"\n")
            words = line.decode("ascii", "replace").split()
            if len(words) >= 2 and words[1] == "stop":
                return "stop"  # a late stop for an earlier result stops the trial as well
            if len(words) == 3 and words[0] == str(sequence) and words[1] == "go":
                self.next_ask = None if words[2] == "-" else int(words[2])
                return "go"

    def close(self) -> None:
        self.sock.close()


class _ReceiverDesk:
    """Asks through the HTTP channel's metrics receiver (one kept-alive connection)."""

    def __init__(self, url: str, token: str) -> None:
        from .receiver_http import ReceiverConnection  # only trials of job platforms ask over HTTP

        self.receiver = ReceiverConnection(url, token, timeout=REQUEST_TIMEOUT_SECONDS)
        self.next_ask: int | None = 0

    def ask(self, trial_id: str, sequence: int) -> str | None:
        """As :meth:`_Desk.ask`. The receiver holds each request a few seconds at most, so a controller
        slower than that is asked again until :data:`VERDICT_WAIT_SECONDS` have passed; a refusal other
        than "too many requests" raises OSError (the desk is not served there, or the trial's token no
        longer counts). None at once when the receiver cannot be reached."""
        deadline = time.monotonic() + VERDICT_WAIT_SECONDS
        while True:
            asked = time.monotonic()
            status, answer = self._request(trial_id, sequence)
            if status is None:
                return None  # the next ask connects again
            if status != 200 and status != 429 and status < 500:
                raise OSError(f"the report desk answered {status}")
            verdict = answer.get("verdict")
            if verdict == "stop":
                return "stop"
            if verdict == "go":
                following = answer.get("next")
                self.next_ask = following if isinstance(following, int) else None
                return "go"
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if time.monotonic() - asked < ASK_AGAIN_SECONDS:  # "no word" at once: not followed (yet), or refused
                time.sleep(min(ASK_AGAIN_SECONDS, left))

    def _request(self, trial_id: str, sequence: int) -> tuple[int | None, dict[str, object]]:
        """One ``GET /verdict``: its status and JSON body (status None: the receiver cannot be reached)."""
        response = self.receiver.request("GET", f"/verdict/{trial_id}?sequence={sequence}")
        if response is None:
            return None, {}
        status, body = response
        if status != 200:
            return status, {}
        answer = json.loads(body)
        return 200, answer if isinstance(answer, dict) else {}

    def close(self) -> None:
        self.receiver.close()


class _Connection:
    desk: _Desk | _ReceiverDesk | None = None
    gone = False  # unreachable or closed once: never asked again


def after_result(trial_id: str, sequence: int, token: Callable[[], str]) -> None:
    """Called after intermediate result ``sequence`` is recorded on the trial's channel: asks the
    desk when the controller wants to judge this result and waits for its answer (see the module).
    ``token`` gives the trial's metrics token (asked only when the desk is the receiver)."""
    where = os.environ.get(REPORT_DESK_ENV)
    if not where or _Connection.gone:
        return
    try:
        desk = _Connection.desk
        if desk is None:
            desk = _Connection.desk = _ReceiverDesk(os.environ["TRIALFLOW_METRICS_URL"], token()) \
                if where == RECEIVER_DESK else _Desk(where)
        if desk.next_ask is None or sequence < desk.next_ask:
            return
        word = desk.ask(trial_id, sequence)
    except (OSError, ValueError, KeyError) as exc:
        if _Connection.desk is not None:
            _Connection.desk.close()
        _Connection.desk, _Connection.gone = None, True
        sys.stderr.write(f"trialflow: the assessor cannot be asked at report time ({type(exc).__name__}: {exc}); "
                         "this trial's results are judged as the controller reads them\n")
        sys.stderr.flush()
        return
    if word == "stop":
        _wait_to_be_ended(sequence)


def _wait_to_be_ended(sequence: int) -> None:
    sys.stderr.write(f"trialflow: the assessor stopped this trial at intermediate result {sequence}; "
                     "it takes no further step\n")
    sys.stderr.flush()
    deadline = time.monotonic() + STOPPED_WAIT_SECONDS
    while time.monotonic() < deadline:
        time.sleep(0.5)
