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

from trialflow.flows.api_outage import OptionalCalls


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
