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
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping

import numpy as np
import tensorflow as tf

from launch.distributed.stragglers import OwnTimes, StragglerWatch

V1 = tf.compat.v1

SCOPE = "towers_ranks"
PUBLISH_EVERY_SECS = 1.0
SILENT_AFTER_SECS = 2.5
TIMEOUT_SECS = 3.0


def rendezvous_url(environ: Mapping[str, str] = os.environ) -> str | None:
    """The Gloo rendezvous store's base URL, or None when there is none."""
    addr, port = environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR"), environ.get(
        "HOROVOD_GLOO_RENDEZVOUS_PORT")
    return f"http://{addr}:{port}" if addr and port else None


class RankReports(V1.train.SessionRunHook):
    """Publishes this rank's liveness and times; reads every rank's (rank 0).

    stragglers: rank 0's judge of every rank's times (None on the others).
    `times.on_phases` listens to this rank's step phases.
    """

    def __init__(self, url: str, rank: int, size: int, stragglers: StragglerWatch | None):
        self._url, self._rank, self._size = url, rank, size
        self._stragglers = stragglers
        self._host = socket.gethostname()
        self.times = OwnTimes()
        self._ended = threading.Event()
        self._thread: threading.Thread | None = None

    def after_create_session(self, session, coord) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="RankReports", daemon=True)
            self._thread.start()

    def end(self, session) -> None:
        self._ended.set()

    def _loop(self) -> None:
        while True:
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
            if self._ended.wait(PUBLISH_EVERY_SECS):
                return

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
        times = np.array([[float(x) for x in r[2:5]] if r else [0.0] * 3 for r in reports])
        names = [f"rank {rank} on {r[5]}" if r else f"rank {rank}"
                 for rank, r in enumerate(reports)]
        self._stragglers.look(times, names, self.times.steps)

    def silent(self) -> list[str]:
        """'rank 1 (silent for 9 s)' for each other rank not reporting, or never having."""
        now, out = time.time(), []
        for rank in range(self._size):
            if rank == self._rank:
                continue
            try:
                report = self._read(rank)
            except OSError:
                return []  # the store does not answer: nothing to say about the ranks
            if report is None:
                out.append(f"rank {rank} (no report yet)")
            elif now - float(report[0]) > SILENT_AFTER_SECS:
                out.append(f"rank {rank} (silent for {now - float(report[0]):.0f} s)")
        return out
