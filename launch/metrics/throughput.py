"""Examples per second: the one definition of each throughput figure towers reports
(docs/figures.md has them for users).

Two counts:

- **this process's examples**: its own steps times its examples per step (its share of
  each global batch, every micro-batch of it);
- **the job's examples**: the global step's advance times the examples one global step
  stands for (`job_examples_per_global_step`): every worker's or rank's together, read
  from the one counter they all move, so any process can tell the job's rate.

Each is reported over an interval (a progress line's, a metric's window) and over the
run. The run starts at the end of its first step: the first holds TensorFlow's one-time
set-up (graph optimisation, allocation, a synchronous job waiting for its workers), which
no later step repeats. A run of one step is that step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import NamedTuple


def job_examples_per_global_step(global_batch: int, processes: int, aggregated: int) -> float:
    """The examples one advance of the global step stands for.

    processes: the processes sharing each global batch (1 alone). aggregated: how many
    of their steps one global step holds: all of them where they step together (one
    process, collective workers, Horovod ranks, a synchronous ps/worker job; fewer with
    train.backup_workers, whose dropped gradients train nothing), 1 for an asynchronous
    ps/worker job, where every worker's step moves the global step by one. Shares that
    differ by one example (towers.shard_sizes) count as their mean.
    """
    return global_batch * aggregated / processes


class Rates(NamedTuple):
    """Examples per second over one span: the job's (all processes) and this process's."""

    job: float
    process: float


class Mark(NamedTuple):
    """A point in the run: when (time.time()), this process's steps, the global step."""

    time: float
    steps: int
    global_step: int


def examples_per_sec(examples: float, seconds: float) -> float:
    return examples / seconds if seconds > 0 else 0.0


@dataclass
class Throughput:
    """This run's marks, and the rates between any two.

    process_examples_per_step: this process's examples per step of its own.
    job_examples_per_step: the examples one global step stands for.
    """

    process_examples_per_step: int
    job_examples_per_step: float
    begin: Mark | None = None  # before the run's first step
    origin: Mark | None = None  # after it: where the run's averages start
    last: Mark | None = None

    def starting(self, global_step: int, now: float | None = None) -> None:
        """The run's first step is about to run, at this global step."""
        if self.begin is None:
            self.begin = Mark(time.time() if now is None else now, 0, global_step)

    def step(self, global_step: int, now: float | None = None) -> Mark:
        """A step of this process has finished; the global step is now `global_step`."""
        steps = self.last.steps + 1 if self.last else 1
        self.last = Mark(time.time() if now is None else now, steps, global_step)
        if self.origin is None:
            self.origin = self.last
        return self.last

    def between(self, start: Mark, end: Mark) -> Rates:
        """The rates from `start` to `end`; the run's first step alone when they are the
        same mark (a line or a window that ends with the first step)."""
        start = self._start(start, end)
        seconds = end.time - start.time
        return Rates(
            examples_per_sec((end.global_step - start.global_step) * self.job_examples_per_step,
                             seconds),
            examples_per_sec((end.steps - start.steps) * self.process_examples_per_step,
                             seconds))

    def seconds_per_global_step(self, start: Mark, end: Mark) -> float:
        """The job's pace from `start` to `end` (every worker moves the global step)."""
        start = self._start(start, end)
        return (end.time - start.time) / max(end.global_step - start.global_step, 1)

    def _start(self, start: Mark, end: Mark) -> Mark:
        return self.begin if start == end == self.origin and self.begin else start

    def run(self) -> Rates | None:
        """The run's averages; None before a step has finished."""
        if self.origin is None:
            return None
        return self.between(self.origin, self.last)

    def timed(self) -> dict:
        """What the run's averages cover, for the result: the span (unix seconds, from the
        end of the first step to the end of the last), this process's steps in it and the
        global step's advance, from which anyone can recompute both rates."""
        start = self.begin if self.origin == self.last else self.origin
        return {"from": round(start.time, 3), "to": round(self.last.time, 3),
                "steps": self.last.steps - start.steps,
                "global_steps": self.last.global_step - start.global_step}
