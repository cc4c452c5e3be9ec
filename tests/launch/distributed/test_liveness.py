"""When a ps/worker task gives up on its peers: one Liveness, a worker's rule and a ps's.

Peers here are names whose answers a test sets, on a clock it moves; the real
processes (a ps killed for good, links cut) are in tests/launch/runtime/test_faults.py
and tests/launch/distributed/test_hosts.py.
"""

import threading
import time

import pytest

from launch.config import from_dict
from launch.distributed.health import liveness
from launch.errors import EXIT_PEER_UNAVAILABLE, PeerUnavailable

PS = {"ps 0": "10.0.0.1:2222", "ps 1": "10.0.0.2:2222"}
WORKERS = {"chief 0": "10.0.1.1:2222", "worker 0": "10.0.1.2:2222"}


def cluster(**keys):
    return from_dict({"cluster": keys}).cluster


class Peers:
    """Which addresses accept connections, and a clock, both set by the test."""

    def __init__(self, monkeypatch, answering):
        self.answering = set(answering)
        self.now = 100.0
        self.lines = []
        monkeypatch.setattr(liveness, "accepts", lambda address: address in self.answering)

    def watch(self, peers, rule):
        return liveness.Liveness(peers, rule, self.lines.append, clock=lambda: self.now)

    def after(self, secs, watched):
        """Move the clock `secs` on, a look every second on the way."""
        for _ in range(int(secs)):
            self.now += 1.0
            watched.check()


def test_a_worker_gives_up_once_one_ps_has_not_answered_for_the_reconnect_timeout(monkeypatch):
    peers = Peers(monkeypatch, PS.values())
    watched = peers.watch(PS, liveness.worker_rule(cluster(reconnect_timeout_secs=5)))
    peers.after(3, watched)
    peers.answering.discard(PS["ps 1"])
    peers.after(5, watched)  # lost at the first of these looks: 4 s silent by the last
    assert peers.lines == [f"lost ps 1 at {PS['ps 1']}; waiting up to 5 s "
                           "(cluster.reconnect_timeout_secs) for it to come back"]
    with pytest.raises(PeerUnavailable) as lost:
        peers.after(1, watched)
    assert str(lost.value) == (
        f"cluster: ps 1 at {PS['ps 1']} has not answered for 5 s "
        "(cluster.reconnect_timeout_secs); giving up. Restart it, then this task: "
        "training resumes from the last checkpoint")
    assert lost.value.exit_status == EXIT_PEER_UNAVAILABLE


def test_a_ps_that_answers_again_in_time_starts_its_clock_afresh(monkeypatch):
    peers = Peers(monkeypatch, PS.values())
    watched = peers.watch(PS, liveness.worker_rule(cluster(reconnect_timeout_secs=5)))
    peers.answering.discard(PS["ps 0"])
    peers.after(4, watched)
    peers.answering.add(PS["ps 0"])
    peers.after(1, watched)
    peers.answering.discard(PS["ps 0"])
    peers.after(5, watched)  # 4 s silent again, not 9
    assert peers.lines[1] == f"ps 0 at {PS['ps 0']} answers again"
    assert len(peers.lines) == 3 and peers.lines[2].startswith("lost ps 0")


def test_a_ps_gives_up_only_once_every_worker_has_been_silent(monkeypatch):
    peers = Peers(monkeypatch, WORKERS.values())
    watched = peers.watch(WORKERS, liveness.ps_rule(cluster(reconnect_timeout_secs=5,
                                                            startup_timeout_secs=60)))
    peers.after(1, watched)
    peers.answering.discard(WORKERS["chief 0"])
    peers.after(30, watched)  # the chief gone for long, worker 0 still there
    peers.answering.clear()
    peers.after(5, watched)
    with pytest.raises(PeerUnavailable) as gone:
        peers.after(1, watched)
    assert str(gone.value) == (
        "cluster: no worker has answered for 5 s (cluster.reconnect_timeout_secs): "
        f"{WORKERS['chief 0']}, {WORKERS['worker 0']}; shutting down this ps")
    assert peers.lines == []  # a ps says nothing of each worker it loses


def test_until_a_worker_first_answers_a_ps_waits_the_startup_timeout(monkeypatch):
    peers = Peers(monkeypatch, [])
    watched = peers.watch(WORKERS, liveness.ps_rule(cluster(reconnect_timeout_secs=5,
                                                            startup_timeout_secs=20)))
    peers.after(20, watched)
    with pytest.raises(PeerUnavailable, match=r"no worker has answered for 20 s "
                                              r"\(cluster.startup_timeout_secs\)"):
        peers.after(1, watched)


def test_peers_are_asked_at_most_once_a_second(monkeypatch):
    peers = Peers(monkeypatch, PS.values())
    asked = []
    monkeypatch.setattr(liveness, "accepts", lambda address: asked.append(address) or True)
    watched = peers.watch(PS, liveness.worker_rule(cluster()))
    for _ in range(5):
        watched.check()
    peers.now += 1.0
    watched.check()
    assert len(asked) == 2 * len(PS)


def test_any_answers_asks_until_one_does(monkeypatch):
    peers = Peers(monkeypatch, [WORKERS["chief 0"]])
    watched = peers.watch(WORKERS, liveness.ps_rule(cluster()))
    assert watched.any_answers(["worker 0", "chief 0"])
    assert not watched.any_answers(["worker 0"])


def test_a_watch_hands_over_the_give_up_from_its_thread_and_stops_with_its_block(monkeypatch):
    monkeypatch.setattr(liveness, "LOOK_EVERY_SECS", 0.01)
    peers = Peers(monkeypatch, [])
    gave_up = threading.Event()
    given = []
    watched = peers.watch(PS, liveness.worker_rule(cluster(reconnect_timeout_secs=5)))
    with liveness.watching(watched, lambda err: given.append(err) or gave_up.set()):
        deadline = time.monotonic() + 10
        while not peers.lines and time.monotonic() < deadline:  # the thread's first look
            time.sleep(0.01)
        peers.now += 5.0  # past the timeout at its next look
        assert gave_up.wait(timeout=10)
    assert "ps 0 at" in str(given[0]) and len(given) == 1

    quiet = peers.watch(PS, liveness.worker_rule(cluster(reconnect_timeout_secs=5)))
    with liveness.watching(quiet, given.append):
        pass
    peers.now += 100.0
    assert not [t for t in threading.enumerate() if t.name == "PeerWatch"]
    assert len(given) == 1
