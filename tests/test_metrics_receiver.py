"""The metrics receiver over real HTTP: tokens scoped to one trial, bad bodies, limits, a burst of
10,000 requests -- each answered with the right status, nothing stored wrongly, the receiver up."""

from __future__ import annotations

import json
import socket
import threading

import pytest
import requests

from trialflow.platforms.metrics_receiver import MetricsReceiver
from trialflow.trial.records import MetricRecord


@pytest.fixture
def receiver():
    r = MetricsReceiver(max_body=64 * 1024).start()
    r.grant("token-A" * 6, "TrA01")
    r.grant("token-B" * 6, "TrB01")
    yield r
    r.stop()


def record(trial: str, seq: int, value=1.0, kind="PERIODICAL") -> str:
    return MetricRecord(trial, kind, seq, value).to_json()


def post(receiver, trial, body, token="token-A" * 6, session=requests):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return session.post(f"{receiver.url}/metrics/{trial}", data=data, headers=headers, timeout=10)


def test_binds_loopback_and_accepts_a_trials_own_metrics_once(receiver):
    assert receiver.url.startswith("http://127.0.0.1:")
    answer = post(receiver, "TrA01", {"metrics": [record("TrA01", 0), record("TrA01", 1, 2.0)]})
    assert answer.status_code == 200 and answer.json() == {"accepted": 2, "duplicates": 0}
    again = post(receiver, "TrA01", {"metrics": [record("TrA01", 1, 2.0)]})  # a retried batch
    assert again.json() == {"accepted": 0, "duplicates": 1}
    assert [(r.sequence, r.value) for r in receiver.drain("TrA01")] == [(0, 1.0), (1, 2.0)]
    assert receiver.drain("TrA01") == []


@pytest.mark.parametrize("token,trial,status", [
    (None, "TrA01", 401),                 # no token
    ("not-a-token", "TrA01", 401),        # unknown token
    ("token-B" * 6, "TrA01", 403),        # another trial's token
])
def test_tokens_only_allow_their_own_trial(receiver, token, trial, status):
    answer = post(receiver, trial, {"metrics": [record(trial, 0)]}, token=token)
    assert answer.status_code == status
    assert receiver.drain(trial) == []


def test_a_record_claiming_another_trial_is_refused(receiver):
    answer = post(receiver, "TrA01", {"metrics": [record("TrA01", 0), record("TrB01", 0)]})
    assert answer.status_code == 422 and "TrB01" in answer.json()["error"]
    assert receiver.drain("TrA01") == [] and receiver.drain("TrB01") == []  # nothing of the batch kept


@pytest.mark.parametrize("body,status,fragment", [
    (b"{not json", 400, "not valid JSON"),
    (b'{"metrics": [NaN]}', 400, "NaN is not valid JSON"),
    (b'{"metrics": Infinity}', 400, "Infinity is not valid JSON"),
    (b'["a list"]', 400, '{"metrics"'),
    (b'{"metrics": ["{\\"type\\": \\"FINAL\\", \\"sequence\\": -1, \\"trial_job_id\\": \\"TrA01\\"}"]}', 422,
     "sequence"),
    (b'{"metrics": [{"type": "BOGUS", "trial_job_id": "TrA01", "sequence": 0}]}', 422, "PERIODICAL or FINAL"),
])
def test_malformed_bodies_get_a_clear_refusal(receiver, body, status, fragment):
    answer = post(receiver, "TrA01", body)
    assert answer.status_code == status and fragment in answer.json()["error"]
    assert receiver.drain("TrA01") == []


def test_nan_and_inf_values_inside_records_are_kept_as_the_file_channel_keeps_them(receiver):
    answer = post(receiver, "TrA01", {"metrics": [record("TrA01", 0, float("nan")), record("TrA01", 1, float("inf"))]})
    assert answer.status_code == 200
    values = [r.value for r in receiver.drain("TrA01")]
    assert values[0] != values[0] and values[1] == float("inf")


def test_oversized_and_lengthless_bodies(receiver):
    big = {"metrics": [record("TrA01", i, "x" * 1000) for i in range(100)]}
    assert post(receiver, "TrA01", big).status_code == 413
    with socket.create_connection(("127.0.0.1", receiver.port)) as sock:
        sock.sendall(f"POST /metrics/TrA01 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {'token-A' * 6}\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n".encode())
        assert b" 411 " in sock.recv(4096).split(b"\r\n")[0] + b" "
    assert receiver.drain("TrA01") == []
    assert post(receiver, "TrA01", {"metrics": [record("TrA01", 0)]}).status_code == 200  # still up


def test_other_paths_and_methods(receiver):
    assert requests.get(f"{receiver.url}/metrics/TrA01", timeout=5).status_code == 405
    assert post(receiver, "TrA01/extra", {"metrics": []}).status_code == 404


def test_a_burst_of_ten_thousand_requests_is_rate_limited_and_nothing_is_stored_wrongly():
    import http.client

    receiver = MetricsReceiver(rate=500, burst=500).start()
    receiver.grant("burst-token" * 3, "TrA01")
    statuses: list[int] = []
    lock = threading.Lock()

    def hammer(worker: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", receiver.port, timeout=10)
        for i in range(2500):
            seq = worker * 2500 + i
            body = json.dumps({"metrics": [record("TrA01", seq, float(seq))]})
            conn.request("POST", "/metrics/TrA01", body, {"Authorization": "Bearer " + "burst-token" * 3})
            response = conn.getresponse()
            response.read()
            with lock:
                statuses.append(response.status)

    threads = [threading.Thread(target=hammer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert len(statuses) == 10_000 and set(statuses) <= {200, 429}
        assert statuses.count(429) > 0 and statuses.count(200) >= 500  # the burst passed, then the limit held
        stored = receiver.drain("TrA01")
        assert len(stored) == statuses.count(200) == receiver.stats.accepted
        assert all(r.value == float(r.sequence) and r.trial_id == "TrA01" for r in stored)
        assert len({r.sequence for r in stored}) == len(stored)
        receiver.grant("other" * 8, "TrB01")
        assert post(receiver, "TrB01", {"metrics": [record("TrB01", 0)]}, token="other" * 8).status_code == 200
    finally:
        receiver.stop()


def test_revoked_tokens_and_environment_tokens(receiver):
    receiver.grant("env-token" * 4)
    assert post(receiver, "TrC01", {"metrics": [record("TrC01", 0)]}, token="env-token" * 4).status_code == 403
    receiver.grant("env-token" * 4, "TrC01")  # the environment now runs TrC01
    assert post(receiver, "TrC01", {"metrics": [record("TrC01", 0)]}, token="env-token" * 4).status_code == 200
    receiver.revoke("token-A" * 6)
    assert post(receiver, "TrA01", {"metrics": [record("TrA01", 0)]}).status_code == 401
