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

from trialflow.foundation.readable import Wakeup
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


@pytest.mark.parametrize("stop", [False, True], ids=["go", "stop"])
def test_a_result_judged_before_the_trial_asked_is_answered_at_once_on_the_socket(desk, stop):
    """A poll may judge a result before the trial's ask about it arrives (the controller reads the
    metric first): the ask is answered at once from that answer, the follower not woken for it."""
    desk.follow("T10")
    desk.answer("T10", 4, stop, None if stop else 7)  # no ask waiting yet
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(5)
        conn.connect(desk.path)
        started = time.monotonic()
        conn.sendall(b"T10 4\n")
        assert conn.recv(256) == (b"4 stop\n" if stop else b"4 go 7\n")
        assert time.monotonic() - started < 1
        assert not select.select([desk.wakeup_fd("T10")], [], [], 0)[0]  # nobody judges result 4 again
        conn.sendall(b"T10 7\n")  # a later result: the stop stands, a go leaves it to the follower
        assert select.select([desk.wakeup_fd("T10")], [], [], 1)[0] == ([] if stop else [desk.wakeup_fd("T10")])
        if stop:
            assert conn.recv(256) == b"7 stop\n"


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


def test_a_followers_wakeup_numbered_past_selects_limit_still_sleeps_and_still_wakes():
    """A controller following hundreds of trials makes wake-ups numbered past 1024, where select()
    refuses them: the follower of a trial that asks over HTTP still sleeps its wait, not a busy loop,
    and still wakes at once when the trial asks."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2048:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(2048, hard), hard))
    taken = [os.dup(0) for _ in range(1100)]  # the descriptors a busy controller already holds
    wakeup = Wakeup()
    try:
        assert wakeup.fd > 1024
        started = time.monotonic()
        wakeup.wait(0.5)
        assert 0.4 < time.monotonic() - started < 5
        wakeup.set()
        started = time.monotonic()
        wakeup.wait(30)
        assert time.monotonic() - started < 5
    finally:
        wakeup.close()
        for fd in taken:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


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


def asking_through(receiver, desk: ReportDesk, trial_id: str, monkeypatch) -> str:
    """Trial ``trial_id`` asks through ``receiver`` with ``desk`` attached and following it; returns the
    trial's token."""
    receiver.attach_desk(desk)
    monkeypatch.setenv(REPORT_DESK_ENV, "receiver")
    token = receiver.new_token()
    receiver.grant(token, trial_id)
    desk.follow(trial_id)
    return token


def test_a_job_platforms_trial_asks_through_the_metrics_receiver_with_its_token(receiver, monkeypatch):
    desk = ReportDesk()  # the receiver's way needs no socket of its own
    try:
        token = asking_through(receiver, desk, "T5", monkeypatch)
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


def test_a_trial_waits_for_a_controller_slower_than_the_receiver_holds_an_ask(receiver, monkeypatch):
    """The receiver answers "no word" after a few seconds; a trial whose controller judges later still
    takes its next step only on the controller's word (a loaded machine: the stop is not missed)."""
    from trialflow.platforms import metrics_receiver

    monkeypatch.setattr(metrics_receiver, "VERDICT_WAIT", 0.3)
    desk = ReportDesk()
    try:
        token = asking_through(receiver, desk, "T7", monkeypatch)
        seen: list[int] = []
        follower(desk, "T7", lambda s: (time.sleep(1.2), (False, s + 3))[1], seen)
        started = time.monotonic()
        verdicts.after_result("T7", 0, lambda: token)
        assert time.monotonic() - started >= 1.2 and seen == [0]
        assert verdicts._Connection.desk is not None and verdicts._Connection.desk.next_ask == 3
    finally:
        desk.close()


@pytest.mark.parametrize("stop", [False, True], ids=["go", "stop"])
def test_an_answer_that_came_between_two_holds_of_an_ask_answers_the_next_one_at_once(stop):
    """The controller may answer just after the receiver's hold of an ask ended and before the trial
    asked again: that ask gets the answer at once, and the controller is not asked to judge the result
    a second time (a stop stands for every later result too)."""
    desk = ReportDesk()
    try:
        desk.follow("T9")
        desk.answer("T9", 4, stop, None if stop else 7)  # no ask was held at that moment
        started = time.monotonic()
        assert desk.ask("T9", 4, timeout=5) == (("stop", None) if stop else ("go", 7))
        assert time.monotonic() - started < 1
        woken = select.select([desk.wakeup_fd("T9")], [], [], 0)[0]
        assert not woken  # the follower is not woken to judge result 4 again
        if stop:
            assert desk.ask("T9", 9, timeout=5) == ("stop", None)
        else:  # a later result is the follower's to judge: no word within the hold
            assert desk.ask("T9", 7, timeout=0.2) is None
    finally:
        desk.close()


def test_a_kept_alive_ask_connection_the_receiver_cut_while_the_trial_stepped_is_replaced(monkeypatch):
    """The receiver cuts idle clients; a trial whose step outlasts that still gets its next answer."""
    from trialflow.platforms.metrics_receiver import MetricsReceiver

    receiver = MetricsReceiver(client_timeout=0.3).start()
    desk = ReportDesk()
    try:
        monkeypatch.setenv("TRIALFLOW_METRICS_URL", receiver.url)
        monkeypatch.setattr(verdicts._Connection, "desk", None)
        monkeypatch.setattr(verdicts._Connection, "gone", False)
        token = asking_through(receiver, desk, "T8", monkeypatch)
        seen: list[int] = []
        follower(desk, "T8", lambda s: (False, s + 1), seen)
        verdicts.after_result("T8", 0, lambda: token)
        time.sleep(1.0)  # a step longer than the receiver keeps an idle connection
        verdicts.after_result("T8", 1, lambda: token)
        assert seen == [0, 1] and verdicts._Connection.desk.next_ask == 2
    finally:
        desk.close()
        receiver.stop()


@pytest.mark.parametrize("way", ["socket", "receiver"])
def test_a_controller_that_never_answers_holds_a_trial_a_bounded_time(way, receiver, monkeypatch):
    from trialflow.platforms import metrics_receiver

    monkeypatch.setattr(metrics_receiver, "VERDICT_WAIT", 0.3)
    monkeypatch.setattr(verdicts, "VERDICT_WAIT_SECONDS", 1.0)
    desk = ReportDesk()
    try:
        token = asking_through(receiver, desk, "T9", monkeypatch)  # followed, but no follower ever answers
        if way == "socket":
            monkeypatch.setenv(REPORT_DESK_ENV, desk.listen())
        started = time.monotonic()
        verdicts.after_result("T9", 0, lambda: token)
        assert 1.0 <= time.monotonic() - started < 3.0 and not verdicts._Connection.gone
    finally:
        desk.close()
