"""Which peers of a ps/worker job answer, since when, and when a task gives up on them.

A peer answers when it accepts a TCP connection (launch.distributed.cluster.peers.accepts). One that
does not is silent from the first look at which it did not answer until a look
at which it does; peers count as answering when the watch begins. A `Rule` says
when silence ends the task, and the two tasks that watch their peers differ only
in theirs:

    a worker  gives up once ANY ps has been silent for cluster.reconnect_timeout_secs:
              it cannot train without every ps (worker_rule);
    a ps      gives up once ALL workers have been silent that long, or for
              cluster.startup_timeout_secs while none has answered yet: workers
              that are all gone will never report finished (ps_rule).

Giving up is PeerUnavailable (exit status 138, retryable). TensorFlow alone would
retry a lost peer for ever. A ps checks from its serving loop; a worker's main
thread is inside TensorFlow's retries by then, so it checks in a thread of its
own (`watching`) and ends the process from there (launch/hard_exit.py).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from launch.config import ClusterConfig
from launch.distributed.cluster.peers import accepts
from launch.errors import PeerUnavailable
from launch.log import log

LOOK_EVERY_SECS = 1.0  # how often peers are asked; asking a silent one takes up to 1 s


@dataclass(frozen=True)
class Allowance:
    """How long peers may stay silent, and the cluster key that says so."""

    secs: float
    key: str

    @classmethod
    def of(cls, cfg: ClusterConfig, key: str) -> Allowance:
        return cls(getattr(cfg, key), key)


@dataclass(frozen=True)
class Silence:
    """Peers silent past their allowance (name -> address), and that allowance."""

    peers: dict[str, str]
    allowance: Allowance


@dataclass(frozen=True)
class Rule:
    """When silence ends a task.

    every: give up once every peer has been silent for the allowance (True), or
        once any one has (False).
    silence: the allowance.
    startup: the allowance while no peer has answered yet (None: `silence` from the start).
    announce: log each peer that goes silent, and that answers again.
    explain: the error message for a Silence that ends the task.
    """

    every: bool
    silence: Allowance
    explain: Callable[[Silence], str]
    startup: Allowance | None = None
    announce: bool = False


def worker_rule(cfg: ClusterConfig) -> Rule:
    """A worker and its ps tasks: any one lost for the reconnect timeout ends it."""
    return Rule(every=False, silence=Allowance.of(cfg, "reconnect_timeout_secs"),
                explain=_lost_ps, announce=True)


def _lost_ps(silence: Silence) -> str:
    name, address = next(iter(silence.peers.items()))
    return (f"cluster: {name} at {address} has not answered for {silence.allowance.secs:g} s "
            f"(cluster.{silence.allowance.key}); giving up. Restart it, then this task: "
            "training resumes from the last checkpoint")


def ps_rule(cfg: ClusterConfig) -> Rule:
    """A ps and the workers: every one silent for the reconnect timeout (the startup
    timeout until one first answers) ends it."""
    return Rule(every=True, silence=Allowance.of(cfg, "reconnect_timeout_secs"),
                startup=Allowance.of(cfg, "startup_timeout_secs"), explain=_no_worker)


def _no_worker(silence: Silence) -> str:
    return (f"cluster: no worker has answered for {silence.allowance.secs:g} s "
            f"(cluster.{silence.allowance.key}): {', '.join(silence.peers.values())}; "
            "shutting down this ps")


class Liveness:
    """The peers a task watches under its Rule. One thread asks (not thread-safe).

    peers: name -> host:port, in the order they are asked (and a silence named).
    """

    def __init__(self, peers: Mapping[str, str], rule: Rule,
                 write: Callable[[str], None] = log, clock: Callable[[], float] = time.monotonic):
        self._peers = dict(peers)
        self._rule = rule
        self._write = write
        self._clock = clock
        self._silent_since: dict[str, float] = {}  # by name: silent at their last look
        self._answered = False  # any peer, at any look
        self._next_look = 0.0

    @property
    def peers(self) -> Mapping[str, str]:
        """Every peer watched (name -> host:port), in the order they are asked."""
        return MappingProxyType(self._peers)

    def any_answers(self, names: Iterable[str]) -> bool:
        """Whether any of `names` answers now: asked in order until one does."""
        return any(self._ask(name) for name in names)

    def check(self) -> None:
        """Ask the peers (at most once every LOOK_EVERY_SECS); raise PeerUnavailable
        once the rule gives up on them."""
        now = self._clock()
        if now < self._next_look:
            return
        self._next_look = now + LOOK_EVERY_SECS
        if self._rule.every:
            self.any_answers(self._peers)  # one answering is enough
        else:
            for name in self._peers:
                self._ask(name)
        silence = self._silence()
        if silence is not None:
            raise PeerUnavailable(self._rule.explain(silence))

    def _ask(self, name: str) -> bool:
        address = self._peers[name]
        if accepts(address):
            self._answered = True
            if self._silent_since.pop(name, None) is not None and self._rule.announce:
                self._write(f"{name} at {address} answers again")
            return True
        if name not in self._silent_since:
            self._silent_since[name] = self._clock()
            if self._rule.announce:
                allowance = self._allowance()
                self._write(f"lost {name} at {address}; waiting up to {allowance.secs:g} s "
                            f"(cluster.{allowance.key}) for it to come back")
        return False

    def _allowance(self) -> Allowance:
        startup = self._rule.startup
        return startup if startup is not None and not self._answered else self._rule.silence

    def _silence(self) -> Silence | None:
        """The peers the rule gives up on, or None while it does not."""
        allowance = self._allowance()
        now = self._clock()
        silent = self._silent_since
        overdue = {name: address for name, address in self._peers.items()
                   if name in silent and now - silent[name] >= allowance.secs}
        if self._rule.every and len(overdue) < len(self._peers):
            return None
        return Silence(overdue, allowance) if overdue else None


@contextlib.contextmanager
def watching(peers: Liveness, give_up: Callable[[PeerUnavailable], None]) -> Iterator[None]:
    """Check `peers` every LOOK_EVERY_SECS from a daemon thread while in the block, and
    hand `give_up` the PeerUnavailable if the rule gives up on them before it ends."""
    done = threading.Event()

    def watch() -> None:
        while not done.wait(LOOK_EVERY_SECS):
            try:
                peers.check()
            except PeerUnavailable as err:
                if not done.is_set():
                    give_up(err)
                return

    thread = threading.Thread(target=watch, name="PeerWatch", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=5)


def not_answering(peers: Mapping[str, str]) -> dict[str, str]:
    """Those of `peers` (name -> host:port) that do not answer now: one look, no memory."""
    return {name: address for name, address in peers.items() if not accepts(address)}
