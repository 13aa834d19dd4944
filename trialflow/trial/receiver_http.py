"""A trial's HTTP connection to the experiment's metrics receiver (standard library only: it runs in trials).

Lifecycle: one kept-alive connection, opened at the first request and kept between requests (a trial
pushes and asks many times). The receiver closes a client idle longer than its timeout, and a trial
stepping through real training often is, so a request that fails on a connection that served earlier
ones is sent once more on a new connection; a request that fails on a new one means the receiver
cannot be reached. A response that says ``Connection: close`` closes the connection after it.
"""

from __future__ import annotations

import http.client
from urllib.parse import urlsplit


def receiver_address(url: str) -> tuple[str, int, str]:
    """(host, port, base path without its trailing slash) of the metrics receiver at ``url``."""
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80, parts.path.rstrip("/")


class ReceiverConnection:
    """Requests to the receiver at ``url`` with the trial's bearer ``token``, ``timeout`` seconds each."""

    def __init__(self, url: str, token: str, timeout: float) -> None:
        self.host, self.port, self.base = receiver_address(url)
        self.token = token
        self.timeout = timeout
        self._conn: http.client.HTTPConnection | None = None

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes] | None:
        """``method`` ``<base><path>``: the response's status and body, or None when the receiver cannot be
        reached (the next request connects again). Raises nothing else."""
        headers = {"Authorization": f"Bearer {self.token}"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        reused = self._conn is not None
        answer = self._once(method, self.base + path, body, headers)
        if answer is None and reused:  # a kept-alive connection the receiver had closed: once more, on a new one
            answer = self._once(method, self.base + path, body, headers)
        return answer

    def _once(self, method: str, url: str, body: bytes | None, headers: dict[str, str]) -> tuple[int, bytes] | None:
        """One request on the kept connection (opened when there is none); None, and no connection kept,
        when it fails."""
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            self._conn.request(method, url, body, headers)
            response = self._conn.getresponse()
            answer = response.read()
        except (OSError, http.client.HTTPException):
            self.close()
            return None
        if response.getheader("Connection", "").lower() == "close":
            self.close()
        return response.status, answer

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None
