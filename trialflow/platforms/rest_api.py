"""One platform REST server spoken to with ``requests`` (OpenPAI, DLTS): a ``Session`` per service,
timeouts on every call, TLS verification on by default (a private CA bundle, or ``verify: false``
with a warning), and HTTP failures turned into platform errors once:

- GET, PUT and DELETE are retried in place on 429 and 5xx (urllib3's ``Retry``, honouring
  ``Retry-After``), up to three times;
- a dropped connection, a timeout, HTTP 5xx and 429 are then :class:`TransientPlatformError` (retried
  by the caller: Prefect's task retries, the poll loop);
- any other refusal is a :class:`PlatformError` naming the call and the server's message;
- 401/403 say the credentials were refused, with the server's address and the caller's hint.

Secrets (tokens, passwords) given as ``secrets`` never leave in a message: every error text is
scrubbed, URLs are shown without their query string, and a filter on urllib3's logger (which logs
request lines, query strings included, at DEBUG) scrubs them from its records too.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Iterable
from typing import Any

import requests
import urllib3
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from .errors import PlatformError, TransientPlatformError, http_error

log = logging.getLogger("trialflow.platforms")
DEFAULT_TIMEOUT = (5.0, 30.0)  # connect, read
# Idempotent calls are retried in place on 429/5xx (honouring Retry-After) before they count as a
# transient failure; a POST never is -- its platform's lookup-by-name makes a retried submit safe.
IN_PLACE_RETRY = Retry(total=3, connect=0, read=0, backoff_factor=0.2, status_forcelist=(429, 500, 502, 503, 504),
                       allowed_methods=frozenset({"GET", "PUT", "DELETE", "HEAD"}), respect_retry_after_header=True,
                       raise_on_status=False)


class _ScrubSecrets(logging.Filter):
    """Replaces every registered secret in urllib3's log records."""

    def __init__(self) -> None:
        super().__init__()
        self.secrets: set[str] = set()
        self.lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secrets:
            text = record.getMessage()
            with self.lock:
                for secret in self.secrets:
                    text = text.replace(secret, MASK)
            record.msg, record.args = text, None
        return True


_SCRUB = _ScrubSecrets()
logging.getLogger("urllib3.connectionpool").addFilter(_SCRUB)


MASK = "**********"  # what a stored config holds in place of a secret


def reveal(secret: Any, field: str, block: str) -> str:
    """A secret from the config or a block; a masked one (a config read back from the store, which
    never keeps secrets) is a clear error saying where the secret must come from instead."""
    value = secret.get_secret_value() if hasattr(secret, "get_secret_value") else str(secret)
    if value == MASK:
        raise PlatformError(f"{field} is not stored with the experiment (secrets never are): save it in a {block} "
                            f"block named by 'credentials', or create the experiment from a config file (trialflow "
                            "create --config), which resume reads again")
    return value


def scrub(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, MASK)
    return text


class RestApi:
    """``base`` + path requests with the session's auth; see the module docstring.

    ``what`` names the server in messages ("the OpenPAI REST server at https://..."), ``auth_hint``
    says how to fix refused credentials."""

    def __init__(self, base: str, what: str, auth_hint: str, *, verify: bool | str = True,
                 headers: dict[str, str] | None = None, params: dict[str, str] | None = None,
                 secrets: Iterable[str] = (), timeout: tuple[float, float] = DEFAULT_TIMEOUT) -> None:
        self.base = base.rstrip("/")
        self.what = what
        self.auth_hint = auth_hint
        self.timeout = timeout
        self.secrets = [s for s in secrets if s]
        with _SCRUB.lock:
            _SCRUB.secrets.update(self.secrets)
        self.session = requests.Session()
        adapter = HTTPAdapter(max_retries=IN_PLACE_RETRY)
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)
        self.session.headers.update(headers or {})
        self.session.params = dict(params or {})
        self.verify = verify  # given with each request: a session's is overridden by $REQUESTS_CA_BUNDLE
        if verify is False:
            log.warning("%s: TLS certificates are not verified (verify: false); anyone on the path can read the "
                        "credentials -- give the cluster's CA bundle instead", what)

    def call(self, method: str, path: str, *, ok: Iterable[int] = (200,), absent: Iterable[int] = (),
             **kwargs: Any) -> requests.Response | None:
        """The response when its status is in ``ok``; None when it is in ``absent`` (e.g. 404 for a
        job that is gone); a platform error otherwise (see the module docstring)."""
        url = f"{self.base}/{path.lstrip('/')}"
        shown = f"{method} {url}"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", urllib3.exceptions.InsecureRequestWarning)
                response = self.session.request(method, url, timeout=self.timeout, verify=self.verify, **kwargs)
        except requests.exceptions.SSLError as exc:
            raise PlatformError(f"{shown}: the TLS certificate of {self.what} was not accepted "
                                f"({scrub(str(exc.__context__ or exc), self.secrets)[:300]}); give the cluster's CA "
                                "bundle (caBundle) or, for a self-signed test cluster, verifyTls: false") from None
        except requests.exceptions.RequestException as exc:
            raise TransientPlatformError(f"{shown}: {self.what} did not answer ({type(exc).__name__}: "
                                         f"{scrub(str(exc), self.secrets)[:300]})") from None
        if response.status_code in set(ok):
            return response
        if response.status_code in set(absent):
            return None
        status, message = response.status_code, scrub(_server_message(response), self.secrets)
        raise http_error(status, f"{shown}: HTTP {status} from {self.what}: {message}",
                         f"{shown}: {self.what} refused the credentials (HTTP {status}: {message}); {self.auth_hint}")

    def close(self) -> None:
        self.session.close()


def _server_message(response: requests.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:500] or response.reason
    if isinstance(body, dict):
        parts = [str(body[k]) for k in ("code", "message", "error") if body.get(k)]
        if parts:
            return ": ".join(parts)[:500]
    return str(body)[:500]
