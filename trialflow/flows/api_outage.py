"""A run's Prefect API that stops answering (``trialflow server stop --force``, a team server going
down): the experiment goes on, its optional calls to Prefect (the cancel check, the UI artifacts)
fail fast and say so once, and its process does not linger at exit over what Prefect could not send.

Prefect's client retries a failed call five times with back-off, ~62 s in all; a run making such a
call every few seconds would stall between trials. :class:`OptionalCalls` makes them once instead;
:func:`rest_of_run_tries_once_if_api_gone` does the same for the engine's final state of a run that
found its API gone; :func:`exit_now_if_api_gone` bounds what Prefect's exit hooks would spend on
undeliverable events, and :func:`drop_what_cannot_reach` does so for a process that goes on (a
notebook's kernel, a script); :func:`api_failure_line` says in one line why a call to the API failed.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

# the settings and profile _without_retries last derived from, and its maker for them (held: while they
# are, their identities are not reused)
_last_without_retries: tuple[Any, Any, Callable[[], Any]] | None = None


def _without_retries() -> Callable[[], Any]:
    """A maker of settings contexts like the current one but with Prefect's client retries off
    (``PREFECT_CLIENT_MAX_RETRIES`` 0, every other setting the current one's): the settings are built
    once per current settings (the last ones are kept: a run's callers share them),
    each context made from them costs microseconds to enter."""
    from prefect.context import SettingsContext, get_settings_context

    global _last_without_retries
    current, last = get_settings_context(), _last_without_retries
    if last is not None and last[0] is current.settings and last[1] is current.profile:
        return last[2]
    # a copy with the one field changed: Prefect's copy_with_update validates every setting again from
    # the environment and profiles (20-40 ms of CPU a run), and an int needs no validation
    client = current.settings.client.model_copy(update={"max_retries": 0})
    settings = current.settings.model_copy(update={"client": client})
    maker = lambda: SettingsContext(profile=current.profile, settings=settings)  # noqa: E731
    _last_without_retries = (current.settings, current.profile, maker)
    return maker


def unreachable(retries: bool = True) -> BaseException | None:
    """Why this context's Prefect API cannot be reached at all (refused, no such host, timed out), or
    None. Asked through Prefect's own client, so its proxy, TLS and auth settings apply; any HTTP answer
    counts as reachable (Prefect Cloud's workspaces need not serve ``/health``)."""
    import httpx
    from prefect.client.orchestration import get_client

    with (nullcontext() if retries else _without_retries()()), get_client(sync_client=True) as client:
        problem = client.api_healthcheck()
    return problem if isinstance(problem, httpx.TransportError) else None


def settings_scope() -> Any:
    """A settings context equal to the current one: a settings context entered and not left inside it
    (:func:`rest_of_run_tries_once_if_api_gone`) ends when it does. Costs microseconds."""
    from prefect.context import SettingsContext, get_settings_context

    current = get_settings_context()
    return SettingsContext(profile=current.profile, settings=current.settings)


def rest_of_run_tries_once_if_api_gone() -> None:
    """Called last in a flow run's function: when this process's last optional call to the run's API
    failed (:class:`OptionalCalls`), Prefect's client tries once from here to the end of the enclosing
    settings context, so the engine's final state of the run (set after the function returns) fails at
    once against an API that is gone instead of backing off for about a minute; otherwise nothing
    changes. The context is entered and not left, for the engine's calls come after the function:
    callers bound it with :func:`settings_scope` (a flow-run process ends with its run)."""
    from prefect.settings import PREFECT_API_URL

    if str(PREFECT_API_URL.value() or "") in OptionalCalls._apis_down:
        _without_retries()().__enter__()


def api_failure_line(exc: BaseException) -> str | None:
    """One line for a failed call to the Prefect API (an HTTP error answer, or no answer), naming the
    API, the call and what came back; None for any other exception."""
    import httpx

    if not isinstance(exc, httpx.HTTPStatusError | httpx.TransportError):
        return None
    try:
        request = exc.request
    except RuntimeError:  # a transport error raised outside a request
        call = ""
    else:  # without user information or query, which may hold credentials
        call = f" {request.method} {request.url.copy_with(username=None, password=None, query=None)}"
    if isinstance(exc, httpx.HTTPStatusError):
        return f"the Prefect API answered{call} with {exc.response.status_code} {exc.response.reason_phrase}"
    return f"the Prefect API did not answer{call}: {type(exc).__name__}: {exc}"


EXIT_DRAIN_SECONDS = 10.0  # how long a run's last events and logs may take to reach an API that is gone


def exit_now_if_api_gone(code: int, failure: str | None = None, ended_by: BaseException | None = None) -> None:
    """After an experiment's run, with its record written (``failure``: what ended the run instead, such
    as Prefect's client failing to set its final state): return when the Prefect API answers (the
    process then exits as usual, Prefect's client delivering what it queued). When it does not, that
    client would try each queued event for seconds at exit -- hours after a long outage -- so it gets
    ``EXIT_DRAIN_SECONDS``, ``failure`` is printed, and the process ends now with ``code``, without
    the exit handlers. So too when ``ended_by`` (the exception that ended the run) is a failed call to
    the API, though it answers (a 503, another server's 401 at its address): what Prefect queued would
    meet the same."""
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():  # Prefect's temporary server: this process's own, up until its exit
        return
    gone = unreachable(retries=False)
    if gone is None and (ended_by is None or api_failure_line(ended_by) is None):
        return
    if failure:
        print(failure, file=sys.stderr)
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    state = f"does not answer ({gone})" if gone else "failed a call"  # which one: in ``failure``
    print(f"the Prefect API {state}: what is left of this run's events and logs is dropped after "
          f"{EXIT_DRAIN_SECONDS:.0f} s", file=sys.stderr)  # the controller's output file
    deadline = time.monotonic() + EXIT_DRAIN_SECONDS
    for worker in (APILogWorker, EventsWorker):
        worker.drain_all(timeout=max(0.0, deadline - time.monotonic()), at_exit=False)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def drop_what_cannot_reach(api_url: str, seconds: float = EXIT_DRAIN_SECONDS) -> None:
    """For a process that goes on after a run whose call to the API at ``api_url`` failed (a notebook's
    kernel, a script): what Prefect's client queued for that API (the run's events and logs) gets
    ``seconds`` to go, and the rest is dropped. Otherwise Prefect's client tries each queued event for
    seconds -- minutes for a run's worth -- in the background and again at the process's exit, logging
    each. Queues for another API are left as they are; the next run starts new ones. Reads Prefect's
    queue services' own state (``_instances``, each one's client and loop task): no public call drops a
    queue. Raises nothing of its own."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    origin = _origin(api_url)
    queues: list[Any] = [*tuple(EventsWorker._instances.values()),  # type: ignore[misc]
                         *tuple(APILogWorker._instances.values())]  # type: ignore[misc]
    stopping = [worker for worker in queues if _origin(_api_of(worker)) == origin]
    tasks = [worker._task for worker in stopping]  # each queue's loop, which stopping lets go of
    done = [worker._drain(at_exit=False) for worker in stopping]  # stopped: sends make new ones
    concurrent.futures.wait(done, timeout=seconds)
    for worker, task, drained in zip(stopping, tasks, done, strict=True):
        if not drained.done() and task is not None:  # the loop ends, what it held with it
            worker._loop.call_soon_threadsafe(task.cancel)
    concurrent.futures.wait(done, timeout=1.0)


def _api_of(queue: Any) -> str:
    """The API a Prefect queue service sends to: its client's, made when it started (Prefect keeps one
    queue per client kind); "" for one not started."""
    client = getattr(queue, "_orchestration_client", None) or getattr(queue, "_client", None)  # events / logs
    return str(getattr(client, "api_url", ""))


def _origin(url: str) -> tuple[str, str, int | None]:
    import httpx

    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        return ("", "", None)
    return (parsed.scheme, parsed.host, parsed.port)


# Calls that are asked again anyway take at most 1/API_SHARE of the controller's time: after a slow or
# failed one, the next waits API_SHARE times as long as it took.
API_SHARE = 20


def next_try_after(interval: float, started: float) -> float:
    """When (``time.monotonic()``) to make a repeated optional call again, that began at ``started``
    and is made every ``interval`` seconds at most: later when it took long (see ``API_SHARE``)."""
    now = time.monotonic()
    return now + max(interval, (now - started) * API_SHARE)


class OptionalCalls:
    """Prefect calls a running experiment can do without: each is made once, without the Prefect
    client's retries (which back off up to a minute in all when the API is gone, so a stopped server
    would stall the run between trials), and an outage is logged once when it begins and once when it
    ends, as ``what`` (e.g. "the cancel check").

    An outage is the API's, not one call's: once any of this process's optional calls to an API
    failed, every one of them tries once until one of them is answered again (the last write of a run
    does not wait out Prefect's retries against an API another call found gone).

    Lifecycle: made inside the flow run (it keeps that settings context: the run's API); ``with
    calls.once():`` around each attempt; :meth:`failed` or :meth:`answered` after it. Raises nothing
    of its own."""

    _apis_down: set[str] = set()  # APIs whose last optional call, of any kind, failed

    def __init__(self, what: str, log: logging.Logger) -> None:
        from prefect.settings import PREFECT_API_URL

        self._one_attempt = _without_retries()
        self.api = str(PREFECT_API_URL.value() or "")
        self.what = what
        self.log = log
        self.failing = False

    def once(self, unless_answering: bool = False) -> Any:
        """A settings context in which Prefect's client tries once (entering it costs microseconds);
        with ``unless_answering``, Prefect's retries stay while the API answered the last call (a call
        that must not be lost to a blip, such as the last one)."""
        answering = not self.failing and self.api not in OptionalCalls._apis_down
        return nullcontext() if unless_answering and answering else self._one_attempt()

    def failed(self, exc: BaseException) -> None:
        if not self.failing:
            self.log.warning("%s: a call to the Prefect API failed (%s); the experiment goes on and tries "
                             "again, and what Prefect shows of it may lag or miss parts until then", self.what, exc)
        self.failing = True
        OptionalCalls._apis_down.add(self.api)

    def answered(self) -> None:
        if self.failing:
            self.log.info("%s: the Prefect API answers again", self.what)
        self.failing = False
        OptionalCalls._apis_down.discard(self.api)
