"""Training series, fed by hooks without a session run of their own per step.

`training_hooks(exporter, ...)` gives the training loop a `MetricsHook`, the callback
ProgressHook hands each step's fetched values to, and a checkpoint listener; with no
exporter (not serving) it gives none. The training thread only stores values;
`TrainMetrics.collect` turns them into series when Prometheus scrapes.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import tensorflow as tf
from prometheus_client import Histogram
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from launch.config import SessionConfig
from launch.metrics.exporter import Exporter, metric_name, set_towers
from launch.metrics.gpu import GpuCollector, process_gpus
from launch.metrics.throughput import Mark, Rates, Throughput

__all__ = [
    "CheckpointMetrics",
    "MetricsHook",
    "TrainMetrics",
    "TrainingHooks",
    "training_hooks",
]

V1 = tf.compat.v1

# Session runs take from under a millisecond (a tiny MLP on CPU) to many
# seconds (a large model), so the buckets double from 1 ms to about a minute.
STEP_BUCKETS = tuple(0.001 * 2**i for i in range(17))
SAVE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0, 300.0)

# Examples/sec is measured over windows of at least this long: one step is too noisy.
RATE_WINDOW_SECS = 1.0
_RATE_DOC = ("Examples/sec over the last {:g} s or more, {}: its examples over the window "
             "(docs/figures.md)")

# How often the learning rate and gradient norm are fetched (see MetricsHook).
OPTIMIZER_VALUES_EVERY_SECS = 1.0

# Run times wait for a scrape to enter the histogram; past this many the training
# thread moves them itself, so an exporter nobody scrapes does not grow without bound.
_UNSCRAPED_DURATIONS = 10_000


def _gauge(name: str, documentation: str, value: Any) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=float(value))


class TrainMetrics:
    """The training series of one process.

    The training thread only stores each step's values (attribute writes and a
    deque append, about a microsecond); `collect` turns them into series when
    Prometheus scrapes, in the server's thread, so even a sub-millisecond step
    pays next to nothing. Checkpoint saves are rare and update plain metrics.
    """

    _DOC = {
        "towers_global_step": "Global step after the last step",
        "towers_examples": "Examples trained on by this process",
        "towers_nonfinite_loss": "Steps whose loss was NaN or infinite",
        "towers_process_examples_per_second": _RATE_DOC.format(
            RATE_WINDOW_SECS, "this process's own"),
        "towers_job_examples_per_second": _RATE_DOC.format(
            RATE_WINDOW_SECS, "the whole job's (every worker or rank; exported by the chief, "
            "rank 0 or a job's one process)"),
        "towers_loss": "Training loss of the last global batch",
        "towers_learning_rate": "Learning rate of a recent step",
        "towers_gradient_norm": "Global norm of a recent step's gradients, before clipping",
        "towers_loss_scale": "Loss scale of a recent step (mixed_float16)",
        "towers_overflow_steps": "Steps skipped because float16 gradients overflowed "
                                 "(mixed_float16; not non-finite steps)",
        "towers_step_phase_seconds": "Seconds of this process's training steps per phase: "
                                     "input wait, compute, gradient exchange, apply",
    }

    def __init__(self, exporter: Exporter, metric_names: Sequence[str], num_towers: int,
                 batch_size: int, job_examples_per_step: float | None = None):
        """batch_size: this process's examples per step. job_examples_per_step: the
        examples one global step stands for, when this process exports the job's rate."""
        self.batch_size = batch_size
        self._exports_job = job_examples_per_step is not None
        self._throughput = Throughput(batch_size, job_examples_per_step or batch_size)
        self._model = {name: metric_name("towers_", name) for name in metric_names}
        for name, full in self._model.items():
            if full in self._DOC or full == "towers_step_seconds":
                raise ValueError(f"model metric {name!r} would be exported as {full}, which "
                                 "towers already exports; rename the metric")
        self._step: int | None = None
        self._steps = 0
        self._nonfinite = 0
        self._overflows: int | None = None  # counted once a loss-scaled job says so
        self._values: Mapping[str, Any] | None = None
        self._optimizer: Mapping[str, Any] | None = None
        self._rates: Rates | None = None
        self._window: Mark | None = None  # where the rates' window began
        self._durations: deque[float] = deque()  # run times not yet in the histogram
        self._phase_seconds: dict[str, float] = {}
        self._histogram = Histogram(  # unregistered: collect() drains into it, then yields it
            "towers_step_seconds", "Wall-clock time of each training session run",
            buckets=STEP_BUCKETS, registry=None)
        set_towers(exporter, num_towers)
        self.last_save = exporter.gauge(
            "towers_checkpoint_last_save_timestamp_seconds",
            "Unix time the last checkpoint was written")
        self.save_seconds = exporter.histogram(
            "towers_checkpoint_save_seconds", "Time to write each checkpoint", SAVE_BUCKETS)
        exporter.add_collector(self)

    def set_global_step(self, step: int) -> None:
        self._step = step

    def record_step(self, step: int, seconds: float, values: Mapping[str, Any]) -> None:
        """One step: its global step, run time, and fetched loss and model metrics."""
        self._step = step
        self._steps += 1
        self._durations.append(seconds)
        if len(self._durations) > _UNSCRAPED_DURATIONS:  # nobody scrapes: keep memory bounded
            self._drain_durations()
        self._values = values
        if not math.isfinite(values["loss"]):
            self._nonfinite += 1
        now = time.time()
        self._throughput.starting(step - 1, now - seconds)  # from the start of the first step
        mark = self._throughput.step(step, now)
        start = self._window or self._throughput.begin
        if mark.time - start.time >= RATE_WINDOW_SECS:
            self._rates = self._throughput.between(start, mark)
            self._window = mark

    def record_phases(self, seconds: Mapping[str, float]) -> None:
        """One step's seconds per phase (input, compute, exchange, apply)."""
        totals = dict(self._phase_seconds)  # replaced whole: collect() reads it unlocked
        for phase, value in seconds.items():
            totals[phase] = totals.get(phase, 0.0) + value
        self._phase_seconds = totals

    def record_optimizer(self, values: Mapping[str, Any]) -> None:
        """The learning rate and gradient norm (and loss scale, if any) of a step."""
        self._optimizer = values

    def count_overflows(self) -> None:
        """This job scales its loss: export the overflow counter, from 0."""
        if self._overflows is None:
            self._overflows = 0

    def record_overflow(self) -> None:
        """A step skipped because its float16 gradients overflowed."""
        self.count_overflows()
        self._overflows += 1

    def _drain_durations(self) -> None:
        """Move pending run times into the histogram (deque pops are thread-safe)."""
        while self._durations:
            try:
                self._histogram.observe(self._durations.popleft())
            except IndexError:  # another thread drained it first
                break

    def describe(self) -> list[Metric]:
        """The names this collector exports, so the registry refuses duplicates."""
        names = [*self._DOC, *self._model.values()]
        return [GaugeMetricFamily(n, "") for n in names] + [self._histogram.describe()[0]]

    def collect(self) -> Iterator[Metric]:
        doc = self._DOC
        self._drain_durations()
        yield from self._histogram.collect()
        yield CounterMetricFamily("towers_examples", doc["towers_examples"],
                                  value=self._steps * self.batch_size)
        yield CounterMetricFamily("towers_nonfinite_loss", doc["towers_nonfinite_loss"],
                                  value=self._nonfinite)
        if self._overflows is not None:
            yield CounterMetricFamily("towers_overflow_steps", doc["towers_overflow_steps"],
                                      value=self._overflows)
        if self._phase_seconds:
            family = CounterMetricFamily("towers_step_phase_seconds",
                                         doc["towers_step_phase_seconds"], labels=["phase"])
            for phase, value in self._phase_seconds.items():
                family.add_metric([phase], value)
            yield family
        step, rates, values, optimizer = self._step, self._rates, self._values, self._optimizer
        if step is not None:
            yield _gauge("towers_global_step", doc["towers_global_step"], step)
        if rates is not None:
            yield _gauge("towers_process_examples_per_second",
                         doc["towers_process_examples_per_second"], rates.process)
            if self._exports_job:
                yield _gauge("towers_job_examples_per_second",
                             doc["towers_job_examples_per_second"], rates.job)
        if values is not None:
            yield _gauge("towers_loss", doc["towers_loss"], values["loss"])
            for name, full in self._model.items():
                yield _gauge(full, f"Model metric {name} of the last global batch", values[name])
        if optimizer is not None:
            for key in ("learning_rate", "gradient_norm", "loss_scale"):
                if key in optimizer:
                    yield _gauge(f"towers_{key}", doc[f"towers_{key}"], optimizer[key])


class MetricsHook(V1.train.SessionRunHook):
    """Feeds TrainMetrics without a session run of its own.

    Every step, ProgressHook passes on what it fetches anyway (global step, loss,
    model metrics) through `on_step`, and this hook only starts the step timer.
    The learning rate and gradient norm, which nothing else fetches, join the
    step's run at most every `every_secs`: a gauge only needs its latest value
    when scraped, and on a small model every extra fetch costs a visible share
    of the step. The only extra session run reads the global step once, when
    the session starts, so a resumed job shows its step before its first step.
    """

    def __init__(self, metrics: TrainMetrics, global_step: tf.Tensor,
                 optimizer_values: Mapping[str, tf.Tensor], gpus: GpuCollector | None = None,
                 every_secs: float = OPTIMIZER_VALUES_EVERY_SECS):
        self._metrics = metrics
        self._global_step = global_step
        self._optimizer_values = dict(optimizer_values)
        self._gpus = gpus
        self._every = every_secs
        self._next_fetch = 0.0
        self._started = time.perf_counter()

    def after_create_session(self, session, coord) -> None:
        self._metrics.set_global_step(int(session.run(self._global_step)))
        if self._gpus is not None:
            self._gpus.enable()

    def before_run(self, run_context):
        self._started = time.perf_counter()
        if self._started < self._next_fetch:
            return None
        self._next_fetch = self._started + self._every
        return V1.train.SessionRunArgs(self._optimizer_values)

    def after_run(self, run_context, run_values) -> None:
        if run_values.results is not None:
            self._metrics.record_optimizer(run_values.results)

    def on_step(self, step: int, values: Mapping[str, Any]) -> None:
        """ProgressHook's values of the step that just ran (its after_run calls this)."""
        self._metrics.record_step(step, time.perf_counter() - self._started, values)


class CheckpointMetrics(V1.train.CheckpointSaverListener):
    """Time of the last checkpoint and how long each save took."""

    def __init__(self, metrics: TrainMetrics):
        self._metrics = metrics
        self._started = 0.0

    def before_save(self, session, global_step_value) -> None:
        self._started = time.perf_counter()

    def after_save(self, session, global_step_value) -> None:
        self._metrics.save_seconds.observe(time.perf_counter() - self._started)
        self._metrics.last_save.set(time.time())


@dataclass
class TrainingHooks:
    """What the training loop adds to serve metrics; all empty when not serving.

    on_step: for ProgressHook(on_step=...), which hands over each step's values.
    on_overflow: for the loss-scale hook, called once per step skipped for overflow.
    on_phases: for StepPhases, called with each step's seconds per phase.
    """

    hooks: list[V1.train.SessionRunHook] = field(default_factory=list)
    listeners: list[V1.train.CheckpointSaverListener] = field(default_factory=list)
    on_step: Callable[[int, Mapping[str, Any]], None] | None = None
    on_overflow: Callable[[], None] | None = None
    on_phases: Callable[[Mapping[str, float]], None] | None = None


def training_hooks(
    exporter: Exporter | None,
    ops,
    learning_rate: tf.Tensor,
    num_towers: int,
    batch_size: int,
    session: SessionConfig,
    job_examples_per_step: float | None = None,
) -> TrainingHooks:
    """The metrics hook, its ProgressHook callback and the checkpoint listener.

    exporter: where to publish; None (not serving) gives no hooks.
    ops: towers.TrainOps (global_step, loss, metrics, gradient_norm, loss_scale).
    batch_size: examples per step in this process.
    job_examples_per_step: the examples a global step stands for, in the one process
    that exports the job's rate (None in the others).
    """
    if exporter is None:
        return TrainingHooks()
    metrics = exporter.part("train", lambda: TrainMetrics(
        exporter, list(ops.metrics), num_towers, batch_size, job_examples_per_step))
    optimizer_values = {"learning_rate": learning_rate, "gradient_norm": ops.gradient_norm}
    if ops.loss_scale is not None:
        optimizer_values["loss_scale"] = ops.loss_scale
        metrics.count_overflows()
    hook = MetricsHook(metrics, ops.global_step, optimizer_values, process_gpus(exporter, session))
    return TrainingHooks([hook], [CheckpointMetrics(metrics)], hook.on_step,
                         metrics.record_overflow, metrics.record_phases)



def data_gauges(exporter: Exporter | None) -> Callable[[float, int], None] | None:
    """Where the data stands, as two gauges: ``towers_data_epoch`` (the passes over the
    data done, 1.5 half way through the second) and ``towers_examples_trained`` (the
    positions the job's steps have taken: launch.data.position). Returns their setter,
    called with (epoch, examples); None when not serving."""
    if exporter is None:
        return None
    epoch = exporter.gauge("towers_data_epoch", "Passes over the training data done")
    examples = exporter.gauge("towers_examples_trained",
                              "Training examples the job's steps have taken")

    def record(done: float, taken: int) -> None:
        epoch.set(done)
        examples.set(taken)

    return record
