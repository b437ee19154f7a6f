"""Ports for tests that start a rendezvous of their own."""

from __future__ import annotations

import random
import socket
from pathlib import Path


def free_port() -> int:
    """A port for the rendezvous that nothing else here will take between now and torchrun's bind: one below
    the kernel's ephemeral range (where every ``bind(0)`` and outgoing connection of the other tests draws
    from), at random, checked free now. A port from ``bind(0)`` could be handed out again before torchrun
    binds it; a listener that took it would hold the job in its rendezvous until the test's timeout."""
    low, _high = (int(part) for part in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    chooser = random.Random()
    for _attempt in range(100):
        port = chooser.randrange(max(1024, low - 12_000), low)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:  # in use: another draw
                continue
            return port
    raise AssertionError("no free port below the ephemeral range")
