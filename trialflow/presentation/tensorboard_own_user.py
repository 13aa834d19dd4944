"""TensorBoard for this user only: ``python -m trialflow.presentation.tensorboard_own_user ARGS`` is
``python -m tensorboard.main ARGS`` whose server, on a loopback address, closes a connection another
local user made before reading a byte of it (TensorBoard's ``server_class`` hook, with
:func:`trialflow.foundation.socket_owner.from_this_user` as its ``verify_request``). On a shared
machine any user can connect to a loopback port; the trials' logs it serves are this user's.

Lifecycle: :mod:`trialflow.presentation.tensorboard` starts it; it serves until a signal stops it. On
a loopback address it exits with one line, once its socket is bound, where the kernel cannot tell
which user makes a connection.
"""

from __future__ import annotations

import ipaddress
import socket
import sys
from typing import Any

from ..foundation.socket_owner import from_this_user, lookup_refusal


def main() -> None:
    """TensorBoard's own command line (``tensorboard.main``'s), with :func:`own_user_server` as its server."""
    from absl import app
    from tensorboard import default, main_lib, program
    from tensorboard.plugins import base_plugin

    main_lib.global_init()
    board = program.TensorBoard(plugins=default.get_plugins(), server_class=own_user_server(program.WerkzeugServer))
    try:
        app.run(board.main, flags_parser=board.configure)
    except base_plugin.FlagsError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        sys.exit(1)


def own_user_server(server: type[Any]) -> type[Any]:
    """``server`` (TensorBoard's Werkzeug server, a ``socketserver`` server) refusing, when it listens
    on a loopback address, every connection another local user made. Made on a loopback address where
    the kernel cannot name a connection's user, it closes its socket and exits with one line."""

    class OwnUserServer(server):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            if self.loopback and (refusal := lookup_refusal("TensorBoard")) is not None:
                self.server_close()
                sys.exit(refusal)

        @property
        def loopback(self) -> bool:
            return ipaddress.ip_address(self.server_address[0]).is_loopback  # else --host: the user's choice

        def verify_request(self, request: socket.socket, client_address: Any) -> bool:
            if not self.loopback:
                return bool(super().verify_request(request, client_address))
            return from_this_user(request)

    return OwnUserServer


if __name__ == "__main__":
    main()
