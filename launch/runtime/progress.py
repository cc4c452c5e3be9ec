"""The progress line every `train.log_every_steps` steps, and the run's record that becomes
the JSON result."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tensorflow as tf

from launch.metrics.throughput import Mark, Rates, Throughput
from launch.runtime.hooks import LastStep

V1 = tf.compat.v1


@dataclass
class StepRecord:
    """What the progress hook knows after a step; the last one becomes the JSON summary.

    loss and metrics: means over the last line's interval. rates: the run's averages
    (launch/metrics/throughput.py); timed: the span they cover.
    """

    global_step: int = 0
    loss: float = float("nan")
    metrics: dict[str, float] = field(default_factory=dict)
    rates: Rates = Rates(0.0, 0.0)
    timed: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {
            "global_step": self.global_step,
            "loss": self.loss,
            "job_examples_per_sec": self.rates.job,
            "process_examples_per_sec": self.rates.process,
            **({"timed": self.timed} if self.timed else {}),
            **self.metrics,
        }


def rates_text(rates: Rates, several: bool, process: str = "process") -> str:
    """'examples/sec=3283.0' for a job of one process (its rate is the job's), else
    'job examples/sec=5180.2 (this worker 2590.1)'."""
    if not several:
        return f"examples/sec={rates.job:.1f}"
    return f"job examples/sec={rates.job:.1f} (this {process} {rates.process:.1f})"


class ProgressHook(V1.train.SessionRunHook):
    """Every `every_steps` steps: one line with step, loss, metrics, examples/sec, ETA.

    Fetches only scalars the step computes anyway (loss, metrics, global step),
    so it adds no session runs. Loss, metrics and examples/sec are over the steps since
    the last line (examples/sec: the job's and, in a job of several processes, this
    process's; launch/metrics/throughput.py). Writes both rates to TensorBoard beside
    the graph's own summaries.

    global_step: the step as each step began (towers.TrainOps.step_started, read
    before the step increments it), which the line numbers steps from.
    last: the job's last step (train.steps, or where the data's passes end if sooner:
    launch.runtime.hooks.LastStep), which the line counts to and the ETA aims at.
    batch_size: this process's examples per step. job_examples_per_step: the examples
    one global step stands for (None: batch_size, a job of one process).
    process: what this process is called on the line ('worker', 'rank').
    on_step: called after every step with the step number and the values fetched
    (global_step, loss, metrics), so others (the metrics exporter) can use them
    without fetching them again: each extra fetch costs Python time every step.
    phases: the step-time shares of the line's interval ('input 31% compute 52% ...'),
    appended to it.
    final_step: in a process that saves the final checkpoint, its step (None until
    saved), which the last line names: the job's step as the checkpoint keeps it.
    """

    def __init__(
        self,
        fetches: Mapping[str, tf.Tensor],
        global_step: tf.Tensor,
        batch_size: int,
        last: LastStep | int,
        every_steps: int,
        summary_dir: str | None,
        write: Callable[[str], None],
        on_step: Callable[[int, Mapping[str, Any]], None] | None = None,
        phases: Callable[[], str] | None = None,
        job_examples_per_step: float | None = None,
        process: str | None = None,
        final_step: Callable[[], int | None] | None = None,
    ):
        self._fetches = {"global_step": global_step, **fetches}
        self._phases = phases
        self._on_step = on_step
        self.throughput = Throughput(batch_size, job_examples_per_step or batch_size)
        self._process = process
        self._final_step = final_step or (lambda: None)
        self._last = last if isinstance(last, LastStep) else LastStep(last)
        self._every = every_steps
        self._summary_dir = summary_dir
        self._write = write
        self._bar = sys.stderr.isatty()
        self.record = StepRecord()
        self.steps_run = 0  # by this session: none when it started at the last step
        self._window: dict[str, list[float]] = {}
        self._last_window: dict[str, list[float]] = {}  # the last line's, for end()
        self._line_mark: Mark | None = None
        self._reported_step: int | None = None

    @property
    def _last_step(self) -> int:
        return self._last.step

    def begin(self) -> None:
        self._writer = (
            V1.summary.FileWriterCache.get(self._summary_dir) if self._summary_dir else None
        )

    def before_run(self, run_context):
        self._started = time.time()
        return V1.train.SessionRunArgs(self._fetches)

    def after_run(self, run_context, run_values) -> None:
        values = run_values.results
        self.steps_run += 1
        step = int(values["global_step"]) + 1  # fetched before this step's increment
        self.throughput.starting(step - 1, self._started)
        mark = self.throughput.step(step)
        if self._on_step is not None:
            self._on_step(step, values)
        for name, value in values.items():
            if name != "global_step":
                self._window.setdefault(name, []).append(float(value))
        # Crossing a multiple, not landing on it: in an asynchronous ps/worker job
        # other workers move the global step too, so it can jump past the multiple.
        if self._reported_step is None:
            self._reported_step = step - 1
        crossed = step // self._every > self._reported_step // self._every
        if crossed or step >= self._last_step:
            self._report(mark)
        elif self._bar:
            self._draw_bar(step)

    def end(self, session) -> None:
        # The step the job ended at: the final checkpoint's where this process saved
        # it, else the global step as it is now; not the last one fetched plus one (a
        # synchronous step whose gradient was dropped, train.backup_workers, did not
        # move it), even when the line before was written at this session's last step.
        step = None
        if self.steps_run:
            saved = self._final_step()
            step = saved if saved is not None else int(session.run(self._fetches["global_step"]))
        if self._window or (step is not None and step != self._reported_step):
            self._window = self._window or self._last_window
            last = self.throughput.last
            self.throughput.last = last._replace(global_step=step)
            self._report(self.throughput.last)
        if self._bar:
            sys.stderr.write("\n")

    def _report(self, mark: Mark) -> None:
        self._reported_step = mark.global_step
        since = self._line_mark or self.throughput.origin
        rates = self.throughput.between(since, mark)
        means = {k: float(np.mean(v)) for k, v in self._window.items()}
        self.record = StepRecord(mark.global_step, means.pop("loss"), means,
                                 self.throughput.run(), self.throughput.timed())
        remaining = (max(self._last_step - mark.global_step, 0)
                     * self.throughput.seconds_per_global_step(since, mark))
        shown = " ".join(f"{k}={v:.4g}" for k, v in means.items())
        phases = self._phases() if self._phases is not None else ""
        self._write(
            f"step {mark.global_step}/{self._last_step} loss={self.record.loss:.4g} {shown} "
            f"{rates_text(rates, self._process is not None, self._process or '')} "
            f"eta={_duration(remaining)}{' ' if phases else ''}{phases}"
        )
        if self._writer is not None:
            summary = V1.Summary(value=[
                V1.Summary.Value(tag="job_examples_per_sec", simple_value=rates.job),
                V1.Summary.Value(tag="process_examples_per_sec", simple_value=rates.process)])
            self._writer.add_summary(summary, mark.global_step)
        self._last_window, self._window = self._window, {}
        self._line_mark = mark

    def _draw_bar(self, step: int) -> None:
        done = step / max(self._last_step, 1)
        width = 30
        filled = int(done * width)
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {step}/{self._last_step}")
        sys.stderr.flush()


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
