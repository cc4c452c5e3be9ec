"""Ports chosen for a job's tasks: distinct, free, and outside the range the kernel
gives outgoing connections (which could take a port between its choice and the bind)."""

import socket

from launch.distributed import ports


def _ephemeral_start() -> int:
    with open(ports.RANGE_FILE) as f:
        return int(f.read().split()[0])


def test_ports_are_distinct_free_and_below_the_ephemeral_range():
    chosen = ports.free_ports(20)
    assert len(set(chosen)) == 20
    assert all(ports.LOWEST <= p < _ephemeral_start() for p in chosen)
    held = []
    try:
        for port in chosen:  # every one can be bound now, by number
            s = socket.socket()
            held.append(s)
            s.bind(("127.0.0.1", port))
    finally:
        for s in held:
            s.close()


def test_a_port_in_use_is_passed_over(monkeypatch):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    free = ports.free_ports(2)
    try:
        monkeypatch.setattr(ports, "_below_ephemeral",
                            lambda: [busy.getsockname()[1], *free])
        assert sorted(ports.free_ports(2)) == sorted(free)
    finally:
        busy.close()


def test_without_the_range_the_kernel_chooses(monkeypatch, tmp_path):
    monkeypatch.setattr(ports, "RANGE_FILE", str(tmp_path / "missing"))
    chosen = ports.free_ports(3)
    assert len(set(chosen)) == 3 and all(p >= 1024 for p in chosen)
