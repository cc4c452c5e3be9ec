"""The bound on a stop. A process told to stop (SIGTERM, SIGINT) stops after its current
step and saves a checkpoint; a step that cannot finish (its input stalled, a peer or a
collective that never answers, a device that hangs) would hold the stop for ever, until
the orchestrator's grace ran out and killed the process (30 s by default in Kubernetes and
Slurm), or for good where nothing would.

So the stop is bounded: `train.stop_timeout_secs` after the signal arrived, if the
training session has not closed by then, a thread of the deadline's own ends the process
(launch/hard_exit.py; the main thread is inside the stuck step, C++ that nothing
interrupts), exit status 138 (retryable), with one line saying what the step waits for.
Nothing is saved after the last checkpoint, which stays the latest and intact.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class StopDeadline:
    """Armed when a stop signal arrives (from any thread); calls `expire` with the
    signal's name from a thread of its own once `secs` have passed, unless the with block
    (the training session) has been left by then. secs None: no bound."""

    def __init__(self, secs: float | None, expire: Callable[[str], None]) -> None:
        self.secs = secs
        self.expire = expire  # may be set once what it needs is built
        self._left = threading.Event()
        self._armed = False

    def __enter__(self) -> StopDeadline:
        return self

    def __exit__(self, *exc) -> None:
        self._left.set()

    def arm(self, name: str) -> None:
        if self.secs is None or self._armed or self._left.is_set():
            return
        self._armed = True
        threading.Thread(target=self._wait, args=(name,), name="StopDeadline",
                         daemon=True).start()

    def _wait(self, name: str) -> None:
        if not self._left.wait(self.secs):
            self.expire(name)
