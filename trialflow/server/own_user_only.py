"""uvicorn for this user only: its HTTP protocol wrapped so that a connection another local user made
is closed before a byte of it is read (:func:`own_user_only`), for the kept server and Prefect's
temporary server alike. On a shared machine any user can connect to a loopback port; with this, no auth
string, ``Host`` or origin another user sends matters, and a server without auth (Prefect's temporary
one) answers its own user only.

``python -m trialflow.server.own_user_only ARGS`` is uvicorn's command line (``python -m uvicorn
ARGS``) with that protocol: what :mod:`trialflow.flows.temporary_server` runs in place of Prefect's
``python -m uvicorn ...``; it serves until a signal stops it. The kept server
(:mod:`trialflow.server.kept_server_app`) passes the protocol to uvicorn itself. Standard library only at
import (uvicorn is imported when its command line runs).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

from ..foundation import socket_owner
from ..foundation.socket_owner import client_uid


def own_user_only(protocol: type[asyncio.Protocol]) -> type[asyncio.Protocol]:
    """``protocol`` (uvicorn's HTTP protocol) for connections from this server's own user: a connection
    whose client socket another uid made (:mod:`trialflow.foundation.socket_owner`) is aborted as it
    is made, before a byte of it is read, so the auth string, Host or origin it would send never matters.
    A connection whose maker the kernel cannot name is aborted too. Each refused uid, and a failed
    lookup, is named once in the server's log, whatever Prefect's server log level."""
    me = os.geteuid()
    named: set[object] = set()

    class OwnUserOnly(protocol):  # type: ignore[misc,valid-type]
        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)  # registered with the server first, so the abort is tidied
            owner: object
            try:
                owner = client_uid(transport.get_extra_info("socket"))
            except OSError as exc:
                owner, why = OSError, f"the kernel did not say which user made it ({exc})"
            else:
                why = f"its client is uid {owner}, not this server's user (uid {me})"
            if owner == me:
                return
            transport.abort()
            if owner is not None and owner not in named:  # None: the client left before the lookup
                named.add(owner)
                _said(f"refused a connection: {why} (and any more like it)")

    return OwnUserOnly


def lookup_refusal() -> str | None:
    """:func:`trialflow.foundation.socket_owner.lookup_refusal` for a Prefect server, with what to do."""
    refusal = socket_owner.lookup_refusal("this server")
    return None if refusal is None else f"{refusal}; use a Prefect server of your own (PREFECT_API_URL)"


def check_lookup() -> None:
    """Before serving: exit at once with :func:`lookup_refusal`'s line where there is one (raises
    SystemExit then), rather than refuse every connection."""
    if (refusal := lookup_refusal()) is not None:
        sys.exit(refusal)


def _said(line: str) -> None:
    sys.stderr.write(f"{time.strftime('%H:%M:%S')} | WARNING | trialflow | {line}\n")
    sys.stderr.flush()


def main(argv: list[str] | None = None) -> None:
    """uvicorn's command line with its default HTTP protocol (``--http auto``) wrapped by
    :func:`own_user_only`. Exits as uvicorn's does (2 on arguments it does not know)."""
    import uvicorn.config
    from uvicorn.main import main as uvicorn_main
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    args = sys.argv[1:] if argv is None else argv
    if any(arg == "--http" or arg.startswith("--http=") for arg in args):
        sys.exit("python -m trialflow.server.own_user_only: --http is not taken (it would leave the check out)")
    check_lookup()
    globals()["OwnUserHTTPProtocol"] = own_user_only(AutoHTTPProtocol)
    uvicorn.config.HTTP_PROTOCOLS["auto"] = f"{__name__}:OwnUserHTTPProtocol"  # what Config loads for "auto"
    uvicorn_main.main(args=args, prog_name="uvicorn")


if __name__ == "__main__":
    main()
