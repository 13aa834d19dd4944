"""The report desk: a trial asks the assessor at report time over a private Unix socket, its follower
is woken at once, and nothing a connection sends is trusted beyond that."""

from __future__ import annotations

import os
import select
import socket
import stat
import threading
import time

import pytest

from trialflow.platforms.report_desk import ReportDesk
from trialflow.trial import verdicts
from trialflow.trial.protocol import REPORT_DESK_ENV


@pytest.fixture
def desk(monkeypatch):
    desk = ReportDesk()
    monkeypatch.setenv(REPORT_DESK_ENV, desk.listen())
    monkeypatch.setattr(verdicts._Connection, "desk", None)
    monkeypatch.setattr(verdicts._Connection, "gone", False)
    yield desk
    desk.close()


def follower(desk: ReportDesk, trial_id: str, verdict, seen: list[int]) -> threading.Thread:
    """A follower as the trial task runs one: woken by an ask, it answers with ``verdict(sequence)``."""
    def run() -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            fd = desk.wakeup_fd(trial_id)
            if fd is None:  # the desk closed
                return
            if not desk.wait(trial_id, 0.2):  # a trial on a Unix connection: as the local service waits
                select.select([fd], [], [], 0.2)
                desk.clear_wakeup(trial_id)
            with desk._lock:
                asking = desk._trials.get(trial_id)
                if asking is None:
                    return
                waiting = list(asking.waiting) + [ask.sequence for ask in asking.http_asks]
            for sequence in waiting:
                seen.append(sequence)
                stop, next_ask = verdict(sequence)
                desk.answer(trial_id, sequence, stop, next_ask)
                if stop:
                    return
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_trial_asks_only_where_the_assessor_decides_and_goes_on_at_once(desk):
    desk.follow("T1")
    seen: list[int] = []
    follower(desk, "T1", lambda s: (False, s + 3), seen)  # ask again three results on
    started = time.monotonic()
    for sequence in range(8):
        verdicts.after_result("T1", sequence, str)
    assert seen == [0, 3, 6]
    assert time.monotonic() - started < 5


def test_a_stopped_trial_takes_no_further_step(desk, monkeypatch):
    monkeypatch.setattr(verdicts, "STOPPED_WAIT_SECONDS", 1.0)
    desk.follow("T2")
    follower(desk, "T2", lambda s: (s == 2, s + 1), [])
    for sequence in range(2):
        verdicts.after_result("T2", sequence, str)
    started = time.monotonic()
    verdicts.after_result("T2", 2, str)  # the controller ends a stopped trial; here nobody does
    assert time.monotonic() - started >= 1.0


def test_a_desk_that_is_gone_costs_a_trial_nothing_and_is_never_asked_again(desk, monkeypatch, capsys):
    desk.close()
    started = time.monotonic()
    for sequence in range(50):
        verdicts.after_result("T3", sequence, str)
    assert verdicts._Connection.gone and time.monotonic() - started < 1.0
    said = capsys.readouterr().err  # once, on the trial's stderr: why its stops come only as the controller reads
    assert said.count("trialflow: the assessor cannot be asked at report time") == 1, said


def test_the_desk_is_private_to_its_user_and_removed_when_closed():
    desk = ReportDesk()
    folder = os.path.dirname(desk.listen())
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    desk.close()
    desk.close()  # idempotent
    assert not os.path.exists(folder)


@pytest.mark.parametrize("line", [b"T9 1\n", b"T4 one\n", b"T4\n", b"x" * 300, b"T4 1\nT9 2\n"],
                         ids=["an-unfollowed-trial", "not-a-number", "no-sequence", "too-long", "another-trial"])
def test_a_crafted_line_closes_its_connection_and_wakes_no_follower(desk, line):
    desk.follow("T4")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(desk.listen())
        conn.sendall(line)
        conn.settimeout(5)
        data = b""
        while chunk := conn.recv(100):  # the desk closes the connection: recv returns b""
            data += chunk
    assert data == b""
    with desk._lock:
        asking = desk._trials["T4"]
        assert asking.conn is None and not asking.waiting


@pytest.fixture
def receiver(monkeypatch):
    from trialflow.platforms.metrics_receiver import MetricsReceiver

    receiver = MetricsReceiver().start()
    monkeypatch.setenv("TRIALFLOW_METRICS_URL", receiver.url)
    monkeypatch.setattr(verdicts._Connection, "desk", None)
    monkeypatch.setattr(verdicts._Connection, "gone", False)
    yield receiver
    receiver.stop()


def test_a_job_platforms_trial_asks_through_the_metrics_receiver_with_its_token(receiver, monkeypatch):
    desk = ReportDesk()  # the receiver's way needs no socket of its own
    try:
        receiver.attach_desk(desk)
        monkeypatch.setenv(REPORT_DESK_ENV, "receiver")
        token = receiver.new_token()
        receiver.grant(token, "T5")
        desk.follow("T5")
        seen: list[int] = []
        follower(desk, "T5", lambda s: (False, s + 2), seen)
        for sequence in range(5):
            verdicts.after_result("T5", sequence, lambda: token)
        assert seen == [0, 2, 4] and not verdicts._Connection.gone
        assert desk.path is None  # no Unix socket is made for trials that ask over HTTP
    finally:
        desk.close()


@pytest.mark.parametrize("attached, granted", [(False, True), (True, False)], ids=["no-desk", "no-grant"])
def test_a_receiver_that_does_not_answer_for_the_trial_is_never_asked_again(receiver, monkeypatch, capsys, attached,
                                                                           granted):
    """Without a desk (404) or with a token not granted this trial (403) the trial stops asking at
    once and its reports go on."""
    import requests

    desk = ReportDesk()  # the receiver's way needs no socket of its own
    try:
        if attached:
            receiver.attach_desk(desk)
        desk.follow("T6")
        token = receiver.new_token()
        receiver.grant(token, "T6" if granted else "other")
        monkeypatch.setenv(REPORT_DESK_ENV, "receiver")
        verdicts.after_result("T6", 0, lambda: token)
        assert verdicts._Connection.gone
        assert f"the report desk answered {403 if attached else 404}" in capsys.readouterr().err
        answer = requests.get(f"{receiver.url}/verdict/T6?sequence=0", timeout=5,
                              headers={"Authorization": f"Bearer {token}"})
        assert answer.status_code == (403 if attached else 404)
        assert requests.get(f"{receiver.url}/verdict/T6?sequence=0", timeout=5).status_code == 401
    finally:
        desk.close()
