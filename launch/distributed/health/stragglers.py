"""Stragglers, named while training: the one rule and the one line for every job of
several processes (ps/worker workers report through ps 0, launch/distributed/
peer_reports.py; Horovod ranks through horovodrun's rendezvous store, rank_reports.py).

Each process keeps the medians over its last WINDOW steps of its own time per step
(input wait plus compute plus apply: its step without the exchange, in which a
synchronous process waits for the others), its input wait and its compute
(`OwnTimes`), and publishes them with its step count and the time (a report row:
ALIVE_AT, STEPS, then the three medians). The chief (rank 0) reads everyone's once a
second. A process is slow when its own time per step is at least `train.straggler_ratio`
times the median of the others' *and* at least `train.straggler_min_secs` more (timing
noise on a shared host is milliseconds: 0.001 s against 0.0004 s is 2.5x and no
straggler). It is named, once, with whether it waits on input or on compute, when it
has been slow for `train.straggler_steps` of the chief's steps and for WINDOW steps of
its own (its medians then hold nothing from before, so one noisy window cannot name
it); it is no longer one once it has not been slow for `train.straggler_steps` of the
chief's steps. A process whose report has gone stale (it is frozen, or gone: the stall
watch names it) takes no part, so its old medians neither name it nor others.
`towers_straggler{peer=...}` says 1 while a process is named, with the name its line
gives.

The cadence and the silence rule are shared too: every process publishes once every
PUBLISH_EVERY_SECS from a thread (`Publisher`), and one that has not for
SILENT_AFTER_SECS is not reporting (`silent_peers`, what a stalled step waits for).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import tensorflow as tf

from launch import metrics
from launch.config import TrainConfig

V1 = tf.compat.v1

WINDOW = 50  # steps: medians ignore the odd long step (a stall, a checkpoint)
OWN, INPUT, COMPUTE = range(3)  # the columns of a process's times
ALIVE_AT, STEPS, TIMES = 0, 1, slice(2, 5)  # a report row: then own, input, compute
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
    """Which processes are stragglers, by the module docstring's rule."""

    def __init__(self, ratio: float, steps: int, min_secs: float = 0.0):
        self.ratio, self.steps, self.min_secs = ratio, steps, min_secs
        self.since: dict[int, tuple[int, float]] = {}  # slow: (chief's steps, own steps)
        self.fine_since: dict[int, int] = {}  # named, not slow: the chief's steps then
        self.named: set[int] = set()

    def slow(self, rows: np.ndarray) -> list[bool]:
        """Which processes' own time per step is a clear margin over the others' median.
        rows: [processes, 5] report rows (`current`); 0 own time takes no part."""
        found = []
        for i, row in enumerate(rows):
            others = [r[TIMES][OWN] for j, r in enumerate(rows) if j != i and r[TIMES][OWN] > 0]
            if not (row[TIMES][OWN] > 0 and others):
                found.append(False)
                continue
            median, own = statistics.median(others), row[TIMES][OWN]
            found.append(own >= self.ratio * median and own - median >= self.min_secs)
        return found

    def judge(self, rows: np.ndarray, chief_steps: int) -> tuple[list[int], list[int]]:
        """(processes newly named stragglers, processes no longer stragglers).
        rows: as `slow`'s."""
        new, recovered = [], []
        for i, slow in enumerate(self.slow(rows)):
            if not slow:
                self.since.pop(i, None)
                began = self.fine_since.setdefault(i, chief_steps)
                if i in self.named and chief_steps - began >= self.steps:
                    self.named.discard(i)
                    recovered.append(i)
                continue
            self.fine_since.pop(i, None)
            began, own_began = self.since.setdefault(i, (chief_steps, rows[i][STEPS]))
            lasting = (chief_steps - began >= self.steps
                       and rows[i][STEPS] - own_began >= WINDOW)
            if i not in self.named and lasting:
                self.named.add(i)
                new.append(i)
        return new, recovered


def current(rows: np.ndarray, now: float) -> np.ndarray:
    """The report rows with the times of a process that has not reported for
    SILENT_AFTER_SECS zeroed: its medians are from before it froze or went."""
    rows = np.array(rows, dtype=np.float64)
    rows[now - rows[:, ALIVE_AT] > SILENT_AFTER_SECS, TIMES] = 0.0
    return rows


def straggler_line(rows: np.ndarray, names: Sequence[str], i: int) -> str:
    """'straggler: worker 1 at h:p takes 3.1x the others' median time of its own per step
    (...), mostly input (...)'. rows: report rows, as Straggler.judge's."""
    own = rows[i][TIMES]
    others = statistics.median(r[TIMES][OWN] for j, r in enumerate(rows)
                               if j != i and r[TIMES][OWN] > 0)
    waits = "input" if own[INPUT] >= own[COMPUTE] else "compute"
    return (f"straggler: {names[i]} takes {own[OWN] / others:.1f}x the others' median time "
            f"of its own per step ({own[OWN]:.3f} s against {others:.3f} s), mostly "
            f"{waits} ({own[INPUT]:.3f} s input wait, {own[COMPUTE]:.3f} s compute)")


class StragglerWatch:
    """The chief's side: judges everyone's reports, writes the lines, sets the metric.

    named: every process named a straggler during the run, by the name its line gave
    (the advice at the end reads it).
    """

    def __init__(self, ratio: float, steps: int, write: Callable[[str], None],
                 exporter: metrics.Exporter | None, min_secs: float = 0.0):
        self._straggler = Straggler(ratio, steps, min_secs)
        self._write = write
        self.named: list[str] = []
        self._gauge = None if exporter is None else exporter.gauge(
            "towers_straggler", "1 while the chief (rank 0) names this process a straggler",
            ["peer"])

    @classmethod
    def for_job(cls, cfg: TrainConfig, write: Callable[[str], None],
                exporter: metrics.Exporter | None) -> StragglerWatch:
        return cls(cfg.straggler_ratio, cfg.straggler_steps, write, exporter,
                   cfg.straggler_min_secs)

    def look(self, rows: np.ndarray, names: Sequence[str], chief_steps: int,
             now: float | None = None) -> None:
        """rows: [processes, 5] report rows; names: each process's, for the line."""
        rows = current(rows, time.time() if now is None else now)
        new, recovered = self._straggler.judge(rows, chief_steps)
        for i in new:
            self._write(straggler_line(rows, names, i))
            if names[i] not in self.named:
                self.named.append(names[i])
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
