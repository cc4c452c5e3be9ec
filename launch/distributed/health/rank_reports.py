"""What each Horovod rank tells rank 0 through horovodrun's own rendezvous server:
that it is alive (a stall), and its recent times per step (a straggler).

A rank frozen whole (SIGSTOP, a hung host) stops Horovod's coordination too, so
Horovod's stall check cannot name it. horovodrun's Gloo launcher already runs an HTTP
key-value store for the ranks' rendezvous (HOROVOD_GLOO_RENDEZVOUS_ADDR and _PORT),
and it keeps scopes its clients add: every rank writes
"<unix time> <steps> <own> <input> <compute> <host>" (launch/distributed/stragglers.py's
`OwnTimes`) under `towers_ranks/rank_<i>` once a second from a thread. Rank 0 reads
them all once a second to name stragglers by stragglers.py's rule, and when its steps
stall. No extra port; without that store (horovodrun over MPI) there is nothing to
read, and the stall line says only what Horovod can.
"""

from __future__ import annotations

import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Mapping

import numpy as np
import tensorflow as tf

from launch.distributed.health.stragglers import OwnTimes, Publisher, StragglerWatch, silent_peers

V1 = tf.compat.v1

SCOPE = "towers_ranks"
TIMEOUT_SECS = 3.0


def rendezvous_url(environ: Mapping[str, str] = os.environ) -> str | None:
    """The Gloo rendezvous store's base URL, or None when there is none."""
    addr, port = environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR"), environ.get(
        "HOROVOD_GLOO_RENDEZVOUS_PORT")
    return f"http://{addr}:{port}" if addr and port else None


class RankReports(Publisher):
    """Publishes this rank's liveness and times; reads every rank's (rank 0).

    stragglers: rank 0's judge of every rank's times (None on the others).
    `times.on_phases` listens to this rank's step phases.
    """

    thread_name = "RankReports"

    def __init__(self, url: str, rank: int, size: int, stragglers: StragglerWatch | None):
        super().__init__()
        self._url, self._rank, self._size = url, rank, size
        self._stragglers = stragglers
        self._host = socket.gethostname()
        self.times = OwnTimes()

    def publish(self) -> None:
        own, input_wait, compute = self.times.medians
        body = (f"{time.time():.3f} {self.times.steps} {own:.6f} {input_wait:.6f} "
                f"{compute:.6f} {self._host}").encode()
        request = urllib.request.Request(self._key(self._rank), data=body, method="PUT")
        try:
            urllib.request.urlopen(request, timeout=TIMEOUT_SECS).close()
            if self._stragglers is not None:
                self._look_for_stragglers()
        except OSError:
            pass  # the store is horovodrun's: if it is gone, so is the job

    def _key(self, rank: int) -> str:
        return f"{self._url}/{SCOPE}/rank_{rank}"

    def _read(self, rank: int) -> list[str] | None:
        """A rank's report split in fields; None when it has written none yet."""
        try:
            with urllib.request.urlopen(self._key(rank), timeout=TIMEOUT_SECS) as reply:
                return reply.read().decode().split()
        except urllib.error.HTTPError:
            return None

    def _look_for_stragglers(self) -> None:
        reports = [self._read(rank) for rank in range(self._size)]
        rows = np.array([[float(x) for x in r[:5]] if r else [0.0] * 5 for r in reports])
        names = [f"rank {rank} on {r[5]}" if r else f"rank {rank}"
                 for rank, r in enumerate(reports)]
        self._stragglers.look(rows, names, self.times.steps)

    def silent(self) -> list[str]:
        """'rank 1 (silent for 9 s)' for each other rank not reporting, or never having."""
        try:
            reports = [self._read(rank) for rank in range(self._size)]
        except OSError:
            return []  # the store does not answer: nothing to say about the ranks
        alive_at = [float(r[0]) if r else None for r in reports]
        names = [f"rank {rank}" for rank in range(self._size)]
        return silent_peers(alive_at, names, self._rank, time.time())
