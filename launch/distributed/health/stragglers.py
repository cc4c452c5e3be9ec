"""Stragglers, named while training: the one rule and the one line for every job of
several processes (ps/worker workers report through ps 0, launch/distributed/
peer_reports.py; Horovod ranks through horovodrun's rendezvous store, rank_reports.py).

Each process keeps the medians over its last WINDOW steps of its own time per step
(input wait plus compute plus apply: its step without the exchange, in which a
synchronous process waits for the others), its input wait and its compute
(`OwnTimes`), and publishes them. The chief (rank 0) reads everyone's once a second: a
process whose own time per step has been at least `train.straggler_ratio` times the
median of the others' for `train.straggler_steps` of the chief's steps is named once,
with whether it waits on input or on compute, and again when it catches up;
`towers_straggler{peer=...}` says 1 while it is one.

The cadence and the silence rule are shared too: every process publishes once every
PUBLISH_EVERY_SECS from a thread (`Publisher`), and one that has not for
SILENT_AFTER_SECS is not reporting (`silent_peers`, what a stalled step waits for).
"""

from __future__ import annotations

import statistics
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import tensorflow as tf

from launch import metrics

V1 = tf.compat.v1

WINDOW = 50  # steps: medians ignore the odd long step (a stall, a checkpoint)
OWN, INPUT, COMPUTE = range(3)  # the columns of a process's times
PUBLISH_EVERY_SECS = 1.0
SILENT_AFTER_SECS = 2.5  # a process that has not published for this long is not reporting


class OwnTimes:
    """This process's finished steps and the medians of its recent (own, input, compute)
    seconds per step; `on_phases` is a StepPhases listener."""

    def __init__(self):
        self._recent: deque[tuple[float, float, float]] = deque(maxlen=WINDOW)
        self.steps = 0
        self.medians = np.zeros(3)  # replaced whole: publishing threads read it

    def on_phases(self, seconds: Mapping[str, float]) -> None:
        """One finished step's seconds per phase."""
        own = seconds["input"] + seconds["compute"] + seconds["apply"]
        self._recent.append((own, seconds["input"], seconds["compute"]))
        self.medians = np.median(np.array(self._recent), axis=0)
        self.steps += 1


class Straggler:
    """Whether one process's own time per step is a clear margin over the others'."""

    def __init__(self, ratio: float, steps: int):
        self.ratio, self.steps = ratio, steps
        self.since: dict[int, int] = {}  # process -> the chief's step count when it began
        self.named: set[int] = set()

    def judge(self, times: np.ndarray, chief_steps: int) -> tuple[list[int], list[int]]:
        """(processes newly named stragglers, processes no longer stragglers).

        times: [processes, 3] of (own, input, compute) medians; 0 own: no report yet.
        """
        new, recovered = [], []
        for i, row in enumerate(times):
            others = [r[OWN] for j, r in enumerate(times) if j != i and r[OWN] > 0]
            slow = bool(others) and row[OWN] >= self.ratio * statistics.median(others)
            if not slow:
                self.since.pop(i, None)
                if i in self.named:
                    self.named.discard(i)
                    recovered.append(i)
                continue
            began = self.since.setdefault(i, chief_steps)
            if i not in self.named and chief_steps - began >= self.steps:
                self.named.add(i)
                new.append(i)
        return new, recovered


def straggler_line(times: np.ndarray, names: Sequence[str], i: int) -> str:
    """'straggler: worker 1 at h:p takes 3.1x the others' median time of its own per step
    (...), mostly input (...)'."""
    others = statistics.median(r[OWN] for j, r in enumerate(times) if j != i and r[OWN] > 0)
    row = times[i]
    waits = "input" if row[INPUT] >= row[COMPUTE] else "compute"
    return (f"straggler: {names[i]} takes {row[OWN] / others:.1f}x the others' median time "
            f"of its own per step ({row[OWN]:.3f} s against {others:.3f} s), mostly "
            f"{waits} ({row[INPUT]:.3f} s input wait, {row[COMPUTE]:.3f} s compute)")


class StragglerWatch:
    """The chief's side: judges everyone's times, writes the lines, sets the metric."""

    def __init__(self, ratio: float, steps: int, write: Callable[[str], None],
                 exporter: metrics.Exporter | None):
        self._straggler = Straggler(ratio, steps)
        self._write = write
        self._gauge = None if exporter is None else exporter.gauge(
            "towers_straggler", "1 while the chief (rank 0) names this process a straggler",
            ["peer"])

    def look(self, times: np.ndarray, names: Sequence[str], chief_steps: int) -> None:
        """times: [processes, 3] as Straggler.judge's; names: each process's, for the line."""
        new, recovered = self._straggler.judge(times, chief_steps)
        for i in new:
            self._write(straggler_line(times, names, i))
        for i in recovered:
            self._write(f"straggler no more: {names[i]} keeps up again")
        if self._gauge is not None:
            for i in new:
                self._gauge.labels(names[i]).set(1)
            for i in recovered:
                self._gauge.labels(names[i]).set(0)


def silent_peers(alive_at: Sequence[float | None], names: Sequence[str], me: int,
                 now: float) -> list[str]:
    """'worker 1 at h:p (silent for 9 s)' for each other process that stopped
    publishing, '... (no report yet)' for one that never has (not started, or not yet
    training). alive_at: each process's last publish time (unix seconds), 0 or None
    for none."""
    silent = []
    for i, (when, name) in enumerate(zip(alive_at, names, strict=True)):
        if i == me:
            continue
        if not when:
            silent.append(f"{name} (no report yet)")
        elif now - when > SILENT_AFTER_SECS:
            silent.append(f"{name} (silent for {now - when:.0f} s)")
    return silent


class Publisher(V1.train.SessionRunHook):
    """Calls `publish` once every PUBLISH_EVERY_SECS, from a thread of its own started
    with the first session, until the session ends: a process's report (and, on the
    chief, its look at everyone's) never waits on a step, nor a step on it."""

    thread_name = "Publisher"

    def __init__(self):
        self._ended = threading.Event()
        self._thread: threading.Thread | None = None

    def publish(self) -> None:
        raise NotImplementedError

    def after_create_session(self, session, coord) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=self.thread_name,
                                            daemon=True)
            self._thread.start()

    def end(self, session) -> None:
        self._ended.set()

    def _loop(self) -> None:
        while True:
            self.publish()
            if self._ended.wait(PUBLISH_EVERY_SECS):
                return
