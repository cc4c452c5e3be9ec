"""One stop-request mechanism: SIGTERM and SIGINT, caught for the length of a with block.

Every part of towers that must stop cleanly (the training loop, the evaluator's
watch, a ps task, the local-cluster launcher, the command before training starts)
uses this class, so each restores the handler it replaced when its block ends and
nested blocks unwind in order. A stop that a `hand_over` block (the command's own, before
its work begins) received is taken over by the next block opened inside it, which begins
stopped: the outer block's own action may not have happened (see __enter__).

Python runs a signal handler in the main thread, between bytecodes: never while that
thread waits inside TensorFlow (a synchronous step blocked on a peer that has
stopped). `notify_threads=True` also tells other threads at once, through the
interpreter's wakeup file descriptor, which the C-level handler writes as the signal
arrives; `on_arrival` is then called from that thread, so a process whose main thread
is stuck in a step that cannot finish still acknowledges the stop at once and can bound
how long it takes (launch/runtime/stop_deadline.py).
"""

from __future__ import annotations

import os
import re
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


_ignoring = False  # set by ignore_from_now, for the rest of the process
_done = False  # set by work_done
_handed_over: int | None = None  # a stop a hand_over block received, not yet taken over


def work_done(done: bool = True) -> None:
    """Say that this process's work is done: its training session has ended, and all that
    is left is its ending (reports to its peers, each bounded), handing its result over
    (a final metrics scrape, printing it) and exiting. A stop request from then on has
    nothing left to stop; the command's own handler (launch.cli) lets it pass, so the
    process still exits with its result (it raised into whatever TensorFlow call the
    ending was in: exit 1, or a wrong "before training started"). `done=False`: a command
    begins (in-process callers run several)."""
    global _done
    _done = done


def is_work_done() -> bool:
    return _done


def ignore_from_now() -> None:
    """For a process whose work is done and which is only ending: a stop request has
    nothing left to stop, and the default action would kill it mid-shutdown with
    -SIGTERM, which a launcher or an orchestrator reports as a failure. It holds for
    the rest of the process: a StopSignals block left later (the command's own, around
    everything) restores no handler over it."""
    global _ignoring
    _ignoring = True
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


@contextmanager
def raised_as_itself(kind: type[BaseException]) -> Iterator[None]:
    """Inside: an exception of `kind` raised by a stop's handler while TensorFlow's C++
    was making an error of its own is raised as itself, not as pybind11's report of it.

    The handler runs wherever the main thread is, the Python __init__ of that error
    included (a timed-out read of a ps; the OutOfRangeError that ends every evaluation
    pass). pybind11 then raises a RuntimeError naming what replaced the error ("...
    REPLACED BY StoppedBeforeStart: SIGTERM"): exit 1 and a traceback, where the stop
    was meant (the soak, sync seed 505).
    """
    try:
        yield
    except RuntimeError as err:
        found = re.search(rf"REPLACED BY {kind.__name__}: (\w+|<EMPTY MESSAGE>)", str(err))
        if found is None:
            raise
        message = found.group(1)
        raise (kind() if message == "<EMPTY MESSAGE>" else kind(message)) from None


class StopSignals:
    """Records the first SIGTERM/SIGINT that arrives inside the with block.

    on_stop: called with the signal's name ("SIGTERM") when the first one
        arrives; it may raise, to break out of a blocking call in the main thread.
    escalate: a SIGINT while a first stop is being acted on raises KeyboardInterrupt
        (handlers restored first): a user pressing Ctrl-C twice means "stop now", not
        "after the checkpoint". A second SIGTERM does not: orchestrators send more than
        one (Slurm's scancel and its own, a restart of every task while one stops), and
        the stop they asked for is under way, bounded by train.stop_timeout_secs (it
        ended a stopping worker by SIGINT with a traceback: soak collective seed 423).
    notify_threads: set `arrived` as soon as a signal arrives, even while the main
        thread is blocked in a C++ call (see the module docstring).
    on_arrival: called once with the signal's name when the first one arrives, from
        whichever thread notices it first (with notify_threads, a thread of its own
        while the main thread is blocked): it must not raise.
    """

    def __init__(
        self,
        on_stop: Callable[[str], None] | None = None,
        *,
        escalate: bool = False,
        notify_threads: bool = False,
        on_arrival: Callable[[str], None] | None = None,
        hand_over: bool = False,
    ) -> None:
        self._on_stop = on_stop
        self._hand_over = hand_over
        self._escalate = escalate
        self._notify_threads = notify_threads
        self._on_arrival = on_arrival
        self._previous: dict[int, object] = {}
        self._wakeup: _WakeupReader | None = None
        self._handled = False  # the main thread's handler has run
        self._lock = threading.RLock()  # the handler may run on a thread inside _arrive
        self.received: str | None = None
        self.arrived = threading.Event()  # for other threads: a stop signal has arrived

    def __enter__(self) -> StopSignals:
        global _handed_over
        self._previous = {s: signal.signal(s, self._handle) for s in STOP_SIGNALS}
        if self._notify_threads:
            self._wakeup = _WakeupReader(self._arrive)
        if _handed_over is not None and not _done:
            # Begin stopped, by the stop a hand_over block received: that block's action
            # may have been lost, what its on_stop raised dropped where Python cannot pass
            # it on (a weakref callback, a __del__; the soak, async seed 406: a ps then
            # served on for good).
            signum, _handed_over = _handed_over, None
            try:
                self._act_on(signum)
            except BaseException:
                self.__exit__()
                raise
        return self

    def __exit__(self, *exc) -> None:
        global _handed_over
        self._restore()
        if self._wakeup is not None:
            self._wakeup.close()
            self._wakeup = None
        if self._hand_over:  # the command has ended (in-process callers run several)
            _handed_over = None

    def __bool__(self) -> bool:
        return self.received is not None

    def _handle(self, signum: int, frame) -> None:
        if self._handled:
            if self._escalate and signum == signal.SIGINT:
                self._restore()
                raise KeyboardInterrupt
            return
        self._act_on(signum)

    def _act_on(self, signum: int) -> None:
        """The main thread's action on the first stop: its own signal, or one taken over."""
        self._handled = True
        self._arrive(signum)
        if self._on_stop is not None:
            self._on_stop(self.received)

    def _arrive(self, signum: int) -> None:
        """The first stop signal, noticed by the main thread's handler or the wakeup
        thread, whichever comes first."""
        global _handed_over
        if self._receive(signal.Signals(signum).name) and self._hand_over:
            _handed_over = signum

    def arrive_from_peer(self, what: str = "another process's stop signal") -> None:
        """A stop that another process of the job received (its stop vote, after the same
        step): this process stops as if it were its own, and says so (its result's
        stopped_by; as finished, an orchestrator would take the job for done)."""
        self._receive(what)

    def _receive(self, name: str) -> bool:
        """Record the first stop; False if one was recorded before."""
        with self._lock:
            if self.received is not None:
                return False
            self.received = name
        self.arrived.set()
        if self._on_arrival is not None:
            self._on_arrival(self.received)
        return True

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, signal.SIG_IGN if _ignoring else handler)
        self._previous = {}


class _WakeupReader:
    """Calls `arrive` with the signal's number when a stop signal arrives, from a thread
    reading the interpreter's wakeup file descriptor (one byte per signal, written by the
    C-level handler)."""

    def __init__(self, arrive: Callable[[int], None]) -> None:
        self._arrive = arrive
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)  # set_wakeup_fd requires it
        self._replaced = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._wait, name="StopSignalsWakeup", daemon=True)
        self._thread.start()

    def _wait(self) -> None:
        stops = {int(s) for s in STOP_SIGNALS}
        while True:
            try:
                data = os.read(self._read, 64)
            except OSError:
                return
            if not data:  # closed
                return
            for signum in stops.intersection(data):
                self._arrive(signum)

    def close(self) -> None:
        signal.set_wakeup_fd(self._replaced)
        os.close(self._write)  # the reader sees end-of-file and returns
        self._thread.join(timeout=5)
        os.close(self._read)
