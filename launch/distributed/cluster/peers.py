"""Waiting for a cluster's peers: a bounded wait, naming the tasks that never answered."""

from __future__ import annotations

import socket
import time
from collections.abc import Mapping

from launch.errors import PeerUnavailable


def wait_for_peers(peers: Mapping[str, str], timeout: float, write) -> None:
    """Block until every peer accepts TCP connections, or fail naming those that never did.

    TensorFlow's own wait for a missing task logs every ten seconds and never gives
    up; a bounded wait with the names of the missing tasks is what an operator needs.
    """
    deadline = time.monotonic() + timeout
    waiting = dict(peers)
    announced = False
    while waiting:
        waiting = {name: a for name, a in waiting.items() if not accepts(a)}
        if not waiting:
            return
        if time.monotonic() >= deadline:
            missing = ", ".join(f"{n} at {a}" for n, a in waiting.items())
            raise PeerUnavailable(f"cluster: gave up after {timeout:g} s waiting for {missing}")
        if not announced:
            write(f"waiting for {', '.join(f'{n} at {a}' for n, a in waiting.items())}")
            announced = True
        time.sleep(0.5)


def accepts(address: str) -> bool:
    """Whether host:port accepts a TCP connection within a second."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
            return True
    except OSError:
        return False
