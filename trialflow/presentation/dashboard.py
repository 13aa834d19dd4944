"""A live optuna-dashboard for one experiment: ``trialflow dashboard ID``, or ``--dashboard`` on
``create --foreground``, ``resume --foreground`` and ``view``.

Lifecycle of :class:`LiveDashboard`: :meth:`~LiveDashboard.start` brings the Optuna study up to date,
serves optuna-dashboard's WSGI app on ``host:port`` (127.0.0.1 by default; port 0 picks a free one; on
loopback, to this user's connections and loopback ``Host`` names only) and keeps the study in step from
a background thread every ``interval`` seconds; :meth:`~LiveDashboard.stop` ends both. While it serves,
the experiment's store holds its address (control ``dashboard_url``), which the running experiment
publishes as a Prefect link artifact.

The study lives in an Optuna JournalStorage file in the experiment's directory
(``dashboard/optuna-journal.log``) unless another storage is given, so a restarted dashboard carries
on where the last one stopped, and ``optuna-dashboard <that file>`` opens it too. The dashboard reads
the store and never writes trials, so experiments without one pay nothing.
"""

from __future__ import annotations

import importlib
import logging
import threading
from pathlib import Path
from socketserver import ThreadingMixIn
from types import ModuleType
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from ..experiments.results import multi_objective
from ..foundation.socket_owner import from_this_user, lookup_refusal
from ..records.search_space import SearchSpace, parse_search_space
from ..records.store import Control, ExperimentStore
from .optuna_mirror import OptunaMirror
from .views import is_maximize_stored

JOURNAL = Path("dashboard") / "optuna-journal.log"
PLOTS_EXTRA = "trialflow[plots]"
log = logging.getLogger("trialflow.dashboard")


def plots_module(name: str) -> ModuleType:
    """Import one of the ``plots`` extra's packages, or say which extra to install."""
    try:
        return importlib.import_module(name)
    except ImportError:
        raise ImportError(f"{name.split('.')[0]} is not installed; install the plots extra: "
                          f"pip install '{PLOTS_EXTRA}'") from None


def stored_space(store: ExperimentStore) -> SearchSpace | None:
    """The experiment's search space from its stored config (None when it cannot be read)."""
    try:
        return parse_search_space(store.experiment().config.get("searchSpace"))
    except ValueError as exc:
        log.warning("the stored search space of %s cannot be read (%s): parameters are shown as attributes",
                    store.experiment_id, exc)
        return None


def study_name_of(store: ExperimentStore) -> str:
    record = store.experiment()
    return f"{record.name} ({record.id})" if record.name else f"trialflow-{record.id}"


def open_mirror(store: ExperimentStore, storage: Any, study_name: str | None = None) -> OptunaMirror:
    """The experiment's mirror in ``storage`` (a URL or an Optuna storage object)."""
    return OptunaMirror(store, storage, study_name or study_name_of(store), is_maximize_stored(store),
                        stored_space(store), multi_objective(store.experiment()))


def journal_storage(experiment_dir: Path) -> Any:
    """The dashboard's default storage: an Optuna journal file in the experiment's directory."""
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    path = experiment_dir / JOURNAL
    path.parent.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(str(path)))


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a browser's open request never holds up stop()
    own_user_only = False  # True: a connection another local user made is closed unread

    def verify_request(self, request: Any, client_address: Any) -> bool:
        return not self.own_user_only or from_this_user(request)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 -- the stdlib's name
        log.debug("dashboard: " + format, *args)


LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def _host_name(header: str) -> str:
    """The name in a ``Host`` header, without its port (``[::1]:8080`` -> ``::1``)."""
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def only_loopback_hosts(app: Any, bound: str) -> Any:
    """The WSGI ``app`` answering only requests whose ``Host`` is a loopback name or the bound address:
    a web page that points some DNS name at 127.0.0.1 (DNS rebinding) is refused with 403."""
    allowed = LOOPBACK_NAMES | {bound}

    def guarded(environ: dict[str, Any], start_response: Any) -> Any:
        if _host_name(environ.get("HTTP_HOST", "")).lower() not in allowed:
            start_response("403 Forbidden", [("Content-Type", "text/plain")])
            return [b"this dashboard answers only http://127.0.0.1 or http://localhost\n"]
        return app(environ, start_response)

    return guarded


class LiveDashboard:
    """optuna-dashboard over a study that follows the experiment (see the module docstring)."""

    def __init__(self, store: ExperimentStore, mirror: OptunaMirror, host: str = "127.0.0.1", port: int = 0,
                 interval: float = 1.0) -> None:
        self.store = store
        self.mirror = mirror
        self.host, self.port, self.interval = host, port, interval
        self._server: _ThreadingServer | None = None
        self._url: str | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        """The study's page (the dashboard's address plus ``/dashboard/studies/<id>``)."""
        if self._url is None:
            raise RuntimeError("the dashboard is not serving")
        return self._url

    def start(self) -> LiveDashboard:
        """Serve and follow (see the module docstring). Raises OSError, in one line, when it cannot listen
        there or, on loopback, cannot tell which user makes a connection."""
        app = plots_module("optuna_dashboard").wsgi(self.mirror.storage)
        if self.host in LOOPBACK_NAMES:  # an explicit other --host is the user's choice (the CLI warns)
            if (refusal := lookup_refusal("the dashboard")) is not None:
                raise OSError(refusal)
            app = only_loopback_hosts(app, self.host)
        self.mirror.sync()
        try:
            self._server = make_server(self.host, self.port, app, server_class=_ThreadingServer,
                                       handler_class=_QuietHandler)
        except OSError as exc:
            raise OSError(f"the dashboard cannot listen on {self.host}:{self.port}: {exc.strerror or exc}; "
                          "choose another --port") from None
        self._server.own_user_only = self.host in LOOPBACK_NAMES
        host = f"[{self.host}]" if ":" in self.host else self.host
        self._url = f"http://{host}:{self._server.server_port}/dashboard/studies/{self.mirror.study_id}"
        self._threads = [threading.Thread(target=self._server.serve_forever, args=(0.05,), name="dashboard-http",
                                          daemon=True),
                         threading.Thread(target=self._follow, name="dashboard-sync", daemon=True)]
        for thread in self._threads:
            thread.start()
        self.store.set_control(Control.DASHBOARD_URL, self.url)
        return self

    def _follow(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.mirror.sync()
            except Exception as exc:  # a busy store or a bad row must not end the dashboard
                log.warning("the dashboard could not catch up with the experiment: %s", exc)

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        for thread in self._threads:
            thread.join(timeout=10)
        try:
            if self._url is not None and self.store.controls().get(Control.DASHBOARD_URL) == self._url:
                self.store.set_control(Control.DASHBOARD_URL, None)
        except Exception as exc:  # the store may be gone with its experiment
            log.debug("could not clear the dashboard address: %s", exc)
        self._server = self._url = None

    def __enter__(self) -> LiveDashboard:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
