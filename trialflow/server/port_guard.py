"""This process connects to the kept server's port only while a socket of this user listens there.

Why: the kept server's clients send its auth string with every call and act on its answers (a flow
run said to be Cancelling stops its experiment). Its keeper (:mod:`trialflow.server.port_keeper`)
holds the port for the server's whole life, but where none does (``trialflow server stop --force``
while experiments run, the keeper killed) another local user could listen there and hear them.

Lifecycle: :func:`guard` adds the server's address to this process's guarded ones and, the first time,
installs an audit hook (:func:`sys.addaudithook`, which lasts as long as the process) on
``socket.connect``, which every client library's connections go through (Prefect's HTTP and websocket
clients, urllib). From then on a connection to a guarded address first asks the kernel which user
made the socket listening there (:func:`trialflow.foundation.socket_owner.listener_uid`); unless it is
this process's user, the connection is refused (:class:`ConnectionRefusedError`, naming that user)
before it is made, as to a server that is down, and one line goes to stderr once per port.

Processes that are not trialflow's (the ``prefect`` commands and workers of a shell that ran
``eval "$(trialflow server env)"``, and the flow runs such a worker starts) never read the auth file:
``server env`` exports :data:`GUARD_ENV` beside the auth string, and the ``.pth`` file trialflow
installs in site-packages calls :func:`guard_from_environment` at every interpreter's start where it
is set. Standard library only.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Any

from ..foundation.socket_owner import listener_uid

# the addresses (``HOST:PORT``, comma-separated) an interpreter guards from its start
GUARD_ENV = "TRIALFLOW_GUARD_PORT"

_guarded: set[tuple[str, int]] = set()
_said: set[int] = set()
_installed = False


def guard(host: str, port: int) -> None:
    """From now on, connections this process makes to ``host`` (an IPv4 address; ``localhost`` too for
    127.0.0.1) and ``port`` reach a listener of this user, or are refused."""
    global _installed
    _guarded.add((host, port))
    if host == "127.0.0.1":
        _guarded.add(("localhost", port))
    if not _installed:
        sys.addaudithook(_on_audit_event)
        _installed = True


def guard_from_environment() -> None:
    """Guard the addresses :data:`GUARD_ENV` names (called at the interpreter's start, see the module).
    A value not of that form is said in one line on stderr, and nothing is guarded."""
    value = os.environ.get(GUARD_ENV, "")
    addresses: list[tuple[str, int]] = []
    for item in filter(None, value.split(",")):
        host, _, number = item.rpartition(":")
        if not host or not number.isdigit() or not 0 < int(number) < 65536:
            print(f"trialflow: {GUARD_ENV}={value!r} is not HOST:PORT[,HOST:PORT...]: no port is guarded; "
                  f'unset it, or run eval "$(trialflow server env)" again', file=sys.stderr, flush=True)
            return
        addresses.append((host, int(number)))
    for address in addresses:
        guard(*address)


def refusal(host: str, port: int) -> str | None:
    """Why a connection to ``host``:``port`` (a guarded address) may not be made now, in one line; None
    when this user's socket listens there."""
    try:
        holder = listener_uid("127.0.0.1" if host == "localhost" else host, port)
    except OSError as exc:
        return f"cannot tell which user listens on port {port} ({exc}): not connecting to it"
    if holder is None or holder == os.geteuid():
        return None  # none listens: the kernel refuses the connection itself
    return (f"port {port} of trialflow's local Prefect server is held by another user (uid {holder}), not by "
            f"the server: not connecting to it; `trialflow server start` once that user lets it go")


def _on_audit_event(event: str, args: tuple[Any, ...]) -> None:
    if event != "socket.connect":
        return
    address = args[1]
    if not (isinstance(address, tuple) and address[:2] in _guarded):
        return
    why = refusal(address[0], address[1])
    if why is None:
        return
    if address[1] not in _said:
        _said.add(address[1])
        print(f"trialflow: {why}", file=sys.stderr, flush=True)
    raise ConnectionRefusedError(errno.ECONNREFUSED, why)
