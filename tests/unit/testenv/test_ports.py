"""Ports handed to test components must not be ones the kernel gives outgoing connections."""

from __future__ import annotations

import socket
from pathlib import Path

from gpu_operator.testenv.processes import free_ports


def test_free_ports_are_distinct_bindable_and_outside_the_ephemeral_range() -> None:
    low, high = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = free_ports(20)
    assert len(set(ports)) == 20
    assert all(not low <= p <= high for p in ports), (ports, low, high)
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("0.0.0.0", port))


def test_a_port_in_use_is_never_handed_out() -> None:
    held = []
    try:
        # Hold most of a small slice: free_ports must skip every held port.
        taken = set()
        for port in free_ports(50):
            sock = socket.socket()
            sock.bind(("127.0.0.1", port))
            sock.listen()
            held.append(sock)
            taken.add(port)
        assert not taken & set(free_ports(50))
    finally:
        for sock in held:
            sock.close()
