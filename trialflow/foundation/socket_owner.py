"""Which local user holds a TCP socket of this machine, asked of the kernel's socket table: one exact
lookup through netlink's ``sock_diag`` (what ``ss`` reads), by the socket's two addresses.

A local server asks it of each connection it accepts (:func:`client_uid`): the client's socket is
the one whose own address is the connection's peer, and whose peer is the server's own address. A
client asks it of the port it is about to connect to (:func:`listener_uid`): the listening socket
there.

Standard library only; Linux only. Any user may ask (no privilege needed); the answer is the uid that
made the socket, as the kernel records it, which the other end cannot choose.
"""

from __future__ import annotations

import errno
import os
import socket
import struct

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20  # the request and its answer
NLM_F_REQUEST = 1  # without NLM_F_DUMP: the one socket whose addresses match, or ENOENT
NLMSG_ERROR = 2
ALL_STATES = 0xFFFF_FFFF
NO_COOKIE = 0xFFFF_FFFF_FFFF_FFFF  # INET_DIAG_NOCOOKIE: match by addresses alone

_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port id
_REQUEST = struct.Struct("=BBBxI")  # inet_diag_req_v2: family, protocol, extensions, pad, states
_ADDRESSES = struct.Struct("!HH16s16s")  # inet_diag_sockid: source and destination port and address
_INTERFACE_AND_COOKIE = struct.Struct("=IQ")  # the rest of inet_diag_sockid
_ERROR = struct.Struct("=i")  # nlmsgerr's error (a negative errno)
# inet_diag_msg: family, state, timer, retransmits (4 bytes), the socket id (48), expires, receive and
# send queues (12), then the uid
_UID = struct.Struct("=I")
_UID_OFFSET = _HEADER.size + 4 + 48 + 12


def tcp_socket_owner(own: tuple[str, int], peer: tuple[str, int], family: int = socket.AF_INET) -> int | None:
    """The uid of the TCP socket whose own address is ``own`` and whose peer is ``peer`` (host, port),
    or None when the kernel holds no such socket (its process closed it meanwhile).

    Raises OSError when the kernel answers otherwise (a kernel without ``sock_diag``, an address of
    another family)."""
    request = _REQUEST.pack(family, socket.IPPROTO_TCP, 0, ALL_STATES) + _ADDRESSES.pack(
        own[1], peer[1], _packed(family, own[0]), _packed(family, peer[0])) + _INTERFACE_AND_COOKIE.pack(0, NO_COOKIE)
    message = _HEADER.pack(_HEADER.size + len(request), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 1, 0) + request
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_SOCK_DIAG) as netlink:
        netlink.sendto(message, (0, 0))
        answer = netlink.recv(8192)
    kind = _HEADER.unpack_from(answer)[1]
    if kind == NLMSG_ERROR:
        error = -_ERROR.unpack_from(answer, _HEADER.size)[0]
        if error == errno.ENOENT:  # no such socket
            return None
        raise OSError(error, f"sock_diag refused the lookup: {os.strerror(error)}")
    if kind != SOCK_DIAG_BY_FAMILY or len(answer) < _UID_OFFSET + _UID.size:
        raise OSError(f"sock_diag answered a message of type {kind}")
    return int(_UID.unpack_from(answer, _UID_OFFSET)[0])


def client_uid(accepted: socket.socket) -> int | None:
    """The uid that made the client end of ``accepted`` (a connection a local server accepted), or None
    when the client closed it meanwhile. Raises OSError as :func:`tcp_socket_owner`."""
    return tcp_socket_owner(accepted.getpeername()[:2], accepted.getsockname()[:2], accepted.family)


def listener_uid(host: str, port: int) -> int | None:
    """The uid that made the socket a TCP connection to ``host`` (an IPv4 address) and ``port`` would
    reach now (the listener bound to that address, or to every address), or None when none listens
    there. Raises OSError as :func:`tcp_socket_owner`."""
    return tcp_socket_owner((host, port), ("0.0.0.0", 0))


def from_this_user(accepted: socket.socket) -> bool:
    """Whether this process's user made the client end of ``accepted``; False also when the kernel
    cannot say (a socketserver's ``verify_request``: a connection it cannot place is refused)."""
    try:
        return client_uid(accepted) == os.geteuid()
    except OSError:
        return False


def lookup_problem() -> str | None:
    """None where the kernel names this process's user as the maker of a loopback connection of its
    own (what a server here will ask of every connection); else what it answered instead, in words (a
    kernel without ``sock_diag``, as in some sandboxes)."""
    with socket.create_server(("127.0.0.1", 0)) as listener, \
            socket.create_connection(listener.getsockname()[:2], timeout=5):
        accepted, _ = listener.accept()
        with accepted:
            try:
                made_by: object = client_uid(accepted)
            except OSError as exc:
                made_by = exc
    return None if made_by == os.geteuid() else f"the kernel's socket table answered {made_by!r}"


def lookup_refusal(server: str) -> str | None:
    """None where :func:`lookup_problem` finds none; else one line saying that ``server`` (its name in
    words) cannot keep other users out, so it does not serve."""
    if (problem := lookup_problem()) is None:
        return None
    return f"{server} cannot tell which user makes a connection to it ({problem}), so it cannot keep other users out"


def _packed(family: int, host: str) -> bytes:
    return socket.inet_pton(family, host).ljust(16, b"\0")
