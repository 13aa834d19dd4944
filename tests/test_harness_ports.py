"""Ports for the servers tests start: chosen where outgoing connections never take them."""

from __future__ import annotations

import socket

from trialflow.testing import ports


def test_a_free_port_is_below_the_ephemeral_range_and_bindable():
    start = ports._ephemeral_start()
    chosen = {ports.free_port() for _ in range(20)}
    assert all(ports.LOWEST <= port < start for port in chosen) and len(chosen) > 1
    with socket.socket() as s:
        s.bind(("127.0.0.1", chosen.pop()))


def test_a_port_in_use_is_never_chosen(monkeypatch):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        monkeypatch.setattr(ports, "LOWEST", taken)
        monkeypatch.setattr(ports, "_ephemeral_start", lambda: taken + 1000)
        assert all(ports.free_port() != taken for _ in range(50))
