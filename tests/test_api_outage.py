"""Optional Prefect calls during an outage: the outage is the API's, seen by every kind of call."""

from __future__ import annotations

import logging
from contextlib import nullcontext

from prefect.settings import (
    PREFECT_API_AUTH_STRING,
    PREFECT_API_URL,
    PREFECT_CLIENT_MAX_RETRIES,
    PREFECT_CLIENT_RETRY_EXTRA_CODES,
    temporary_settings,
)

from trialflow.flows.api_outage import OptionalCalls, api_failure_line


def test_a_last_write_tries_once_when_another_call_found_the_api_gone(monkeypatch):
    monkeypatch.setattr(OptionalCalls, "_apis_down", set())
    log = logging.getLogger("test")
    run_settings = {PREFECT_API_URL: "http://127.0.0.1:9/api", PREFECT_API_AUTH_STRING: "user:secret",
                    PREFECT_CLIENT_RETRY_EXTRA_CODES: {502}}
    with temporary_settings(updates=run_settings):
        retries = PREFECT_CLIENT_MAX_RETRIES.value()
        assert retries > 0
        cancel_check, artifacts = OptionalCalls("the cancel check", log), OptionalCalls("the artifacts", log)
        assert isinstance(artifacts.once(unless_answering=True), nullcontext)  # answering: Prefect's retries
        cancel_check.failed(ConnectionRefusedError())
        with artifacts.once(unless_answering=True):  # gone: one try, not a minute of back-off
            assert PREFECT_CLIENT_MAX_RETRIES.value() == 0
            # every other setting is the run's: the same API, auth string and client options
            assert {s: s.value() for s in run_settings} == run_settings
        assert PREFECT_CLIENT_MAX_RETRIES.value() == retries
        cancel_check.answered()
        assert isinstance(artifacts.once(unless_answering=True), nullcontext)
    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:10/api"}):
        assert isinstance(OptionalCalls("another API", log).once(unless_answering=True), nullcontext)


def test_a_failed_call_is_one_line_naming_the_call_without_credentials_in_its_address():
    """What a foreground run prints when a call to the Prefect API failed: the method, the address
    without user information or query (a user may keep a password or token there), and what came back."""
    import httpx

    request = httpx.Request("POST", "https://user:pw@prefect.example:4200/api/flow_runs/r1/set_state?token=t0k")
    response = httpx.Response(503, request=request)
    answered = api_failure_line(httpx.HTTPStatusError("Server error", request=request, response=response))
    assert answered == ("the Prefect API answered POST https://prefect.example:4200/api/flow_runs/r1/set_state "
                        "with 503 Service Unavailable")
    unanswered = api_failure_line(httpx.ConnectError("[Errno 111] Connection refused", request=request))
    assert unanswered == ("the Prefect API did not answer POST https://prefect.example:4200/api/flow_runs/r1/"
                          "set_state: ConnectError: [Errno 111] Connection refused")
    assert api_failure_line(httpx.ConnectError("refused")) == "the Prefect API did not answer: ConnectError: refused"
    assert api_failure_line(ValueError("not a call")) is None
