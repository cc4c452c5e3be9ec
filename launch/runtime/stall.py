"""Stalls, named while stuck: when no step has finished for train.stall_warning_secs,
say what the process waits for, once and then at doubling intervals; after
train.stall_abort_secs (when set) end the process with status 138.

The main thread is inside the stuck session run by then (C++ that nothing
interrupts), so a thread of the watch's own looks at the clock, asks what the step
waits for and, to abort, ends the process itself (launch/hard_exit.py). A step that has
not got its batch waits for its input, whatever the process (launch/runtime/
input_watch.py); one past its input waits for what the role says (`cause`: its devices,
which workers have stopped reporting, which ps does not answer, ...).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import tensorflow as tf

from launch.errors import Stalled, TowersError
from launch.runtime.input_watch import batches_taken, waits_for_input

V1 = tf.compat.v1

LOOK_EVERY_SECS = 0.5
READ_WAIT_SECS = 3.0  # for the batch count's read (its own timeout is 2 s)
# A look this much later than due: the process itself did not run in between (SIGSTOP,
# a paused container or VM, a host starved of CPU), and nothing it waited for is to blame.
SUSPENDED_AFTER_SECS = 2.0
NO_BATCH = ("the step waits for its input: the input pipeline has given it no batch (a "
            "source that gives no data, or a reader that is stuck)")


def no_batch_text(examples: int, example_bytes: int, memory_bytes: int | None) -> str:
    """What a step without its batch waits for: its input, or, when the batch is too
    large to assemble (more than half this host's memory), its size."""
    batch = examples * example_bytes
    if memory_bytes is None or batch <= memory_bytes / 2:
        return NO_BATCH
    return (f"the step waits for its input: its batch of {examples:,} examples "
            f"({batch / 2**30:,.1f} GiB) is too large to assemble in this host's "
            f"{memory_bytes / 2**30:,.1f} GiB of memory; lower train.batch_size (each process "
            "assembles its own part of the global batch: more workers or ranks split it)")


def example_bytes(*tensors: tf.Tensor) -> int:
    """The bytes one example takes in a batch of `tensors` ([b, ...] each, the rest of
    the shape known)."""
    return sum(tensor.shape[1:].num_elements() * tensor.dtype.size for tensor in tensors)


def host_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def stall_text(seconds: float, warning_secs: float, cause: str) -> str:
    """'no step has finished for 12 s (train.stall_warning_secs: 10): <cause>'."""
    return (f"no step has finished for {seconds:.0f} s (train.stall_warning_secs: "
            f"{warning_secs:g}): {cause}")


class StallWatch(V1.train.SessionRunHook):
    """Watches the time since the last step finished (or the session started).

    cause: what a step past its input waits for, asked from the watch's thread while
        stalled.
    abort: ends the process with the error (launch.hard_exit.exit_now).
    no_batch: what a step without its batch waits for (no_batch_text).
    """

    def __init__(self, warning_secs: float, abort_secs: float | None,
                 cause: Callable[[], str], write: Callable[[str], None],
                 abort: Callable[[TowersError], None], no_batch: str = NO_BATCH):
        self._no_batch = no_batch
        self._warning = warning_secs
        self._abort_secs = abort_secs
        self._cause = cause
        self._write = write
        self._abort = abort
        self._last_end = time.monotonic()
        self._next_warning = warning_secs
        self._warned = False
        self._ended = threading.Event()
        self._thread: threading.Thread | None = None
        self._taken: tf.Tensor | None = None
        self._session = None
        self._finished = 0  # steps of this session
        self._reading: threading.Thread | None = None
        # A step's end and a warning are written one at a time: a warning whose step ended
        # while the watch asked what it waits for is not written (it came after "steps go
        # on again", under load).
        self._lock = threading.Lock()

    def begin(self) -> None:
        self._taken = batches_taken(V1.get_default_graph())

    def after_create_session(self, session, coord) -> None:
        self._last_end = time.monotonic()
        self._session, self._finished = session, 0
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="StallWatch", daemon=True)
            self._thread.start()

    def after_run(self, run_context, run_values) -> None:
        with self._lock:
            self._finished += 1
            now = time.monotonic()
            if self._warned:
                self._write(f"steps go on again after {now - self._last_end:.0f} s without one")
            self._last_end = now
            self._next_warning = self._warning
            self._warned = False

    def end(self, session) -> None:
        self.stop()

    def stop(self) -> None:
        """Watch no more: no step is due (the session ends, or waits on purpose)."""
        self._ended.set()

    def _watch(self) -> None:
        looked = time.monotonic()
        while not self._ended.wait(LOOK_EVERY_SECS):
            looked = self.look(looked, time.monotonic())

    def look(self, looked: float, now: float) -> float:
        """One look at the clock, `now`, the last having been at `looked`; returns now.

        A look far later than due means this process was not running: it says so, and
        its stall clock starts again, since its step did not wait on anything.
        """
        missed = now - looked - LOOK_EVERY_SECS
        if missed > SUSPENDED_AFTER_SECS:
            self._write(f"this process did not run for {missed:.0f} s (it was suspended: "
                        "SIGSTOP, a paused container or VM, or a host starved of CPU); its "
                        "steps go on")
            self._last_end = max(self._last_end, now)
            self._next_warning = self._warning
            return now
        stalled = now - self._last_end
        if self._abort_secs is not None and stalled >= self._abort_secs:
            self._abort(Stalled(
                f"train.stall_abort_secs: no step finished for {stalled:.0f} s; "
                f"{self._what_it_waits_for()}. Restart the job: training resumes from the "
                "last checkpoint"))
        if stalled >= self._next_warning:
            finished = self._finished
            text = stall_text(stalled, self._warning, self._what_it_waits_for())
            with self._lock:
                if self._finished == finished:  # no step ended while it was asked
                    self._warned = True
                    self._write(text)
                    self._next_warning = 2 * max(stalled, self._warning)  # less often
        return now

    def _what_it_waits_for(self) -> str:
        if self._taken is not None and self._session is not None and self._waits_for_input():
            return self._no_batch
        return self._cause()

    def _waits_for_input(self) -> bool | None:
        """Whether the stuck step has not got its batch, from a read of the session in a
        thread of its own, at most READ_WAIT_SECS (None: no answer). The read can block
        beyond its own timeout while the step is stuck (a Horovod rank in a collective
        its peer never joins), and the watch, the stall's abort and a stop's deadline
        must go on without it."""
        if self._reading is not None and self._reading.is_alive():
            return None  # the last read has not come back
        answer: list[bool | None] = []
        session, taken, finished = self._session, self._taken, self._finished
        self._reading = threading.Thread(
            target=lambda: answer.append(waits_for_input(session, taken, finished)),
            name="StallWatchRead", daemon=True)
        self._reading.start()
        self._reading.join(READ_WAIT_SECS)
        return answer[0] if answer else None

    def waits_for(self) -> str:
        """What this process waits for now, asked from any thread (a stop's deadline)."""
        if self._session is None:
            return "the training session has not started (it waits for its peers or the chief)"
        if self._ended.is_set():
            return "the session is closing (its final checkpoint, its peers' end of the job)"
        return self._what_it_waits_for()
