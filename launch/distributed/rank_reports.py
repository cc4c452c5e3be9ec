"""Which Horovod ranks are still alive, told through horovodrun's own rendezvous server.

A rank frozen whole (SIGSTOP, a hung host) stops Horovod's coordination too, so
Horovod's stall check cannot name it. horovodrun's Gloo launcher already runs an HTTP
key-value store for the ranks' rendezvous (HOROVOD_GLOO_RENDEZVOUS_ADDR and _PORT),
and it keeps scopes its clients add: every rank writes "<unix time> <steps>" under
`towers_ranks/rank_<i>` once a second from a thread, and rank 0 reads them when its
steps stall. No extra port; without that store (horovodrun over MPI) there is nothing
to read, and the stall line says only what Horovod can.
"""

from __future__ import annotations

import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping

import tensorflow as tf

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
    """Publishes this rank's liveness and step count; reads every rank's (rank 0)."""

    def __init__(self, url: str, rank: int, size: int):
        self._url, self._rank, self._size = url, rank, size
        self._steps = 0
        self._ended = threading.Event()
        self._thread: threading.Thread | None = None

    def after_create_session(self, session, coord) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="RankReports", daemon=True)
            self._thread.start()

    def after_run(self, run_context, run_values) -> None:
        self._steps += 1

    def end(self, session) -> None:
        self._ended.set()

    def _loop(self) -> None:
        while True:
            body = f"{time.time():.3f} {self._steps}".encode()
            request = urllib.request.Request(self._key(self._rank), data=body, method="PUT")
            try:
                urllib.request.urlopen(request, timeout=TIMEOUT_SECS).close()
            except OSError:
                pass  # the store is horovodrun's: if it is gone, so is the job
            if self._ended.wait(PUBLISH_EVERY_SECS):
                return

    def _key(self, rank: int) -> str:
        return f"{self._url}/{SCOPE}/rank_{rank}"

    def silent(self) -> list[str]:
        """'rank 1 (silent for 9 s)' for each other rank not reporting, or never having."""
        now, out = time.time(), []
        for rank in range(self._size):
            if rank == self._rank:
                continue
            try:
                with urllib.request.urlopen(self._key(rank), timeout=TIMEOUT_SECS) as reply:
                    written = float(reply.read().split()[0])
            except urllib.error.HTTPError:
                out.append(f"rank {rank} (no report yet)")
                continue
            except OSError:
                return []  # the store does not answer: nothing to say about the ranks
            if now - written > SILENT_AFTER_SECS:
                out.append(f"rank {rank} (silent for {now - written:.0f} s)")
        return out
