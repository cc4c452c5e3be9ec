"""A stop request that arrives before a command has begun its work (training, serving as a
ps, watching checkpoints): nothing is built that a stop could save, so the command exits
cleanly, 0, instead of dying by the signal: an orchestrator or local-cluster sees a task
that stopped, not one that failed. Once the work begins, its own StopSignals block takes
the signals over (and takes over a stop that arrived before it, launch.runtime.signals).

    with stops_before_start():      # around the whole command
        ...
    except StoppedBeforeStart as stopped: print(...); return 0
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from launch.runtime.signals import StopSignals, is_work_done, raised_as_itself


class StoppedBeforeStart(BaseException):
    """SIGTERM/SIGINT arrived before the command installed its own handling.

    Raised by the signal's handler wherever the main thread then is, often inside
    TensorFlow's import, whose `except Exception` turned it into a TypeError and a
    traceback (exit 1; the soak, sync and async seed 401). Like KeyboardInterrupt, it is
    no Exception, so no library's handler of errors takes it for one of its own.
    """


@contextmanager
def stops_before_start() -> Iterator[StopSignals]:
    """SIGTERM/SIGINT raise StoppedBeforeStart in the main thread until the block ends,
    unless the work is done (the job then hands over its result and exits 0)."""
    with _lost_stops_quiet(), StopSignals(_raise_unless_done, hand_over=True) as stop, \
            raised_as_itself(StoppedBeforeStart):
        yield stop


def _raise_unless_done(name: str) -> None:
    if not is_work_done():
        raise StoppedBeforeStart(name)


@contextmanager
def _lost_stops_quiet() -> Iterator[None]:
    """A stop raised where Python drops what is raised (a weakref callback, a __del__) is
    not lost: the next StopSignals block takes it over. So it prints no traceback;
    anything else dropped still does."""
    previous = sys.unraisablehook

    def hook(unraisable) -> None:
        if not isinstance(unraisable.exc_value, StoppedBeforeStart):
            previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous
