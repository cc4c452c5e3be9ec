"""Ports for the tasks of a job on one host, chosen before the tasks start.

A port the kernel hands out for a bind to port 0 is free when asked, but it comes from
the ephemeral range (Linux: /proc/sys/net/ipv4/ip_local_port_range, 32768-60999 by
default), the same range every outgoing connection takes its source port from: between
the choice and the task's own bind, a gRPC channel of any process on the host may take
it ("address already in use"). A port below that range is never given to a connection,
so once found free it stays free unless another process binds it by number. Where the
range cannot be read, the kernel's choice is the fallback.
"""

from __future__ import annotations

import random
import socket

RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
LOWEST = 10_000  # below: ports services are configured on by number


def free_ports(count: int) -> list[int]:
    """`count` distinct ports of 127.0.0.1 free now, outside the ephemeral range."""
    candidates = _below_ephemeral()
    if candidates is None:
        return _kernel_chosen(count)
    random.SystemRandom().shuffle(candidates)  # two jobs starting at once pick apart
    sockets: list[socket.socket] = []
    try:
        for port in candidates:
            if len(sockets) == count:
                break
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            sockets.append(s)
        if len(sockets) < count:
            return _kernel_chosen(count)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _below_ephemeral() -> list[int] | None:
    """The ports from LOWEST up to the ephemeral range's start; None if unknown."""
    try:
        with open(RANGE_FILE) as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return list(range(LOWEST, low)) if low - LOWEST >= 1_000 else None


def _kernel_chosen(count: int) -> list[int]:
    """Ports the kernel says are free now (held open together so they are distinct)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()
