"""Small SessionRunHooks for the training loop: the last step, the end of the data,
signals, placement trace, non-finite steps (the progress line is launch/runtime/progress.py)."""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import tensorflow as tf

from launch.errors import Diverged
from launch.runtime.signals import StopSignals
from towers import NONFINITE_GRADIENT, NONFINITE_LOSS

V1 = tf.compat.v1


@dataclass
class LastStep:
    """The global step a job stops at: train.steps, or the step at which the data's
    passes end (data.epochs) if that comes first, known once the session has started."""

    steps: int
    data_end: int | None = None

    @property
    def step(self) -> int:
        return self.steps if self.data_end is None else min(self.steps, self.data_end)

    @property
    def by_data(self) -> bool:
        """The data's passes end the job, not train.steps."""
        return self.data_end is not None and self.data_end < self.steps


class StopAtStepHook(V1.train.StopAtStepHook):
    """TensorFlow's StopAtStepHook, at the job's last step (``last``: train.steps, or
    where the data's passes end if sooner, set as the session starts, before this hook
    runs), which also stops a session that starts at or past the last step before it
    takes any: TensorFlow's checks only after a step, so running a finished job again
    trained one more step (and saved one more checkpoint) each time.

    start_step: the global step the session started at (restored, or 0).
    done_at_start: the session started at or past the last step; the loop takes no
    step then. (Not a request to the session's coordinator: that would stop a sync
    chief's queue runner, and close its token queue, before the hooks' end() runs.)
    """

    def __init__(self, last: LastStep, write: Callable[[str], None], epochs: int | None = None):
        super().__init__(last_step=last.steps)
        self._last = last
        self._epochs = epochs
        self._write = write
        self.start_step: int | None = None
        self.done_at_start = False

    def after_create_session(self, session, coord) -> None:
        super().after_create_session(session, coord)
        self._last_step = self._last.step
        self.start_step = int(session.run(self._global_step_tensor))
        self.done_at_start = self.start_step >= self._last_step
        if not self.done_at_start:
            return
        if self._last.by_data:
            self._write(f"at step {self.start_step} already, where the data's "
                        f"{self._epochs} pass(es) end (data.epochs): no step to take")
        else:
            self._write(f"at step {self.start_step} already, train.steps is "
                        f"{self._last.steps}: no step to take")


class DataEndHook(V1.train.SessionRunHook):
    """Whether the session ended because this process's input ran out (data.epochs).

    MonitoredSession ends quietly on the OutOfRangeError of a step whose input has run
    out: that step never reaches after_run, and end() is called while it is in flight.
    Another queue closed under a step ends it the same way (a synchronous worker's token
    queue, which the chief closes as it stops), so the input counts as run out only
    when the steps done have taken every batch it was started with: never for an input
    without an end (no data.epochs).

    batches: the batches this session's input was started with (None: no end), known
    once the session has started.
    """

    def __init__(self, batches: Callable[[], int | None] = lambda: None) -> None:
        self._batches = batches
        self.in_step = False
        self.steps = 0

    def after_create_session(self, session, coord) -> None:
        self.steps = 0

    def before_run(self, run_context):
        self.in_step = True

    def after_run(self, run_context, run_values) -> None:
        self.in_step = False
        self.steps += 1

    @property
    def ran_out(self) -> bool:
        """Asked once the session has ended: it ended mid-step, on the end of its data."""
        batches = self._batches()
        return self.in_step and batches is not None and self.steps >= batches


class StopOnSignalHook(V1.train.SessionRunHook):
    """A stop request (SIGTERM, SIGINT) asks the loop to stop after the current step.

    The session then closes normally, so the checkpoint hook's end() writes a
    final checkpoint: preemption loses nothing.

    unblock: an op that lets a step blocked on peers return (a synchronous worker
    waiting for a gradient a stopped worker will never send). When a stop request
    finds a step running for longer than blocked_after() (BLOCKED_SECS, or three times
    the longest of this session's last steps after its first: a step that is slow, on a
    loaded host or with a large model, is not blocked), a thread runs it, again every
    BLOCKED_SECS, until the step returns. Needs `stop` made with notify_threads.
    """

    BLOCKED_SECS = 2.0
    RECENT_STEPS = 10

    def __init__(self, stop: StopSignals, unblock: tf.Operation | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self._stop = stop
        self._unblock = unblock
        self._clock = clock
        self._step_started: float | None = None
        self._recent: collections.deque[float] = collections.deque(maxlen=self.RECENT_STEPS)
        self._steps = 0  # of this session
        self._session = None  # the latest: MonitoredSession re-creates it after a lost ps
        self._ended = threading.Event()

    def after_create_session(self, session, coord) -> None:
        if self._unblock is not None and self._session is None:
            threading.Thread(target=self._unblock_when_stopped, name="UnblockOnStop",
                             daemon=True).start()
        self._session = session
        self._steps = 0

    def before_run(self, run_context):
        self._step_started = self._clock()

    def after_run(self, run_context, run_values) -> None:
        started, self._step_started = self._step_started, None
        self._steps += 1
        if started is not None and self._steps > 1:  # a session's first step waits for its peers
            self._recent.append(self._clock() - started)
        if self._stop:
            run_context.request_stop()

    def blocked_after(self) -> float:
        """How long a step runs before a stop takes it for blocked on its peers."""
        return max(self.BLOCKED_SECS, 3 * max(self._recent, default=0.0))

    def end(self, session) -> None:
        self._ended.set()

    def _unblock_when_stopped(self) -> None:
        while not self._ended.is_set():
            if not self._stop.arrived.wait(0.5):
                continue
            started = self._step_started
            if started is not None and self._clock() - started > self.blocked_after():
                try:
                    self._session.run(self._unblock)
                except (tf.errors.OpError, RuntimeError):
                    pass  # the session is closing, or the peer holding the op is gone
            self._ended.wait(self.BLOCKED_SECS)


class PlacementTraceHook(V1.train.SessionRunHook):
    """Traces the first step so TensorBoard's graph shows which device ran each op."""

    def __init__(self, summary_dir: str):
        self._summary_dir = summary_dir
        self._done = False

    def before_run(self, run_context):
        if self._done:
            return None
        options = V1.RunOptions(trace_level=V1.RunOptions.FULL_TRACE)
        return V1.train.SessionRunArgs(None, options=options)

    def after_run(self, run_context, run_values) -> None:
        if not self._done and run_values.run_metadata is not None:
            writer = V1.summary.FileWriterCache.get(self._summary_dir)
            writer.add_run_metadata(run_values.run_metadata, "first_step")
            writer.flush()
        self._done = True


class SkipNonFiniteHook(V1.train.SessionRunHook):
    """train.on_nonfinite: skip. Reports each step whose update the graph skipped
    (towers' nonfinite="skip"), and raises Diverged after more than `limit` in a row.

    Raising from after_run makes MonitoredSession close without running the hooks'
    end(), so no checkpoint is written on the way out.
    """

    def __init__(self, applied: tf.Tensor, global_step: tf.Tensor, limit: int,
                 write: Callable[[str], None], overflow: tf.Tensor | None = None):
        self._fetches = {"applied": applied, "global_step": global_step}
        if overflow is not None:  # mixed_float16: an overflow is the loss scale's business
            self._fetches["overflow"] = overflow
        self._limit = limit
        self._write = write
        self.in_a_row = 0
        self.skipped = 0

    def before_run(self, run_context):
        return V1.train.SessionRunArgs(self._fetches)

    def after_run(self, run_context, run_values) -> None:
        if run_values.results["applied"]:
            self.in_a_row = 0
            return
        if run_values.results.get("overflow"):
            return  # skipped for the loss scale, not a non-finite step (LossScaleHook says so)
        self.in_a_row += 1
        self.skipped += 1
        step = int(run_values.results["global_step"]) + 1
        self._write(
            f"step {step}: non-finite loss or gradient; update skipped "
            f"({self.in_a_row} in a row, at most {self._limit} allowed)"
        )
        if self.in_a_row > self._limit:
            raise Diverged(
                f"{self.in_a_row} steps in a row had a non-finite loss or gradient "
                f"(train.max_nonfinite_steps is {self._limit})"
            )


class LossScaleHook(V1.train.SessionRunHook):
    """mixed_float16: says so when a step was skipped because its float16 gradients
    overflowed (the loss scale then shrinks), counts those steps and keeps the last
    scale. Such a step is not a non-finite one: it never stops or fails the job.

    on_overflow: called once per such step (the metrics' counter).
    """

    def __init__(self, overflow: tf.Tensor, loss_scale: tf.Tensor, global_step: tf.Tensor,
                 write: Callable[[str], None], on_overflow: Callable[[], None] | None = None):
        self._fetches = {"overflow": overflow, "scale": loss_scale, "global_step": global_step}
        self._write = write
        self._on_overflow = on_overflow
        self.overflows = 0
        self.scale: float | None = None

    def before_run(self, run_context):
        return V1.train.SessionRunArgs(self._fetches)

    def after_run(self, run_context, run_values) -> None:
        results = run_values.results
        self.scale = float(results["scale"])
        if not results["overflow"]:
            return
        self.overflows += 1
        if self._on_overflow is not None:
            self._on_overflow()
        self._write(
            f"step {int(results['global_step']) + 1}: float16 gradients overflowed at loss "
            f"scale {self.scale:g}; update skipped and the scale lowered (not a non-finite step)"
        )


@contextlib.contextmanager
def nonfinite_stops(checkpoint_dir: str | None) -> Iterator[None]:
    """Turn the graph's check_numerics failure (towers' nonfinite="raise") into Diverged,
    naming the checkpoint a restart would resume from: the last good one, since the
    failed step applied nothing and the session closes without saving."""
    try:
        yield
    except tf.errors.InvalidArgumentError as err:
        found = [w for w in (NONFINITE_LOSS, NONFINITE_GRADIENT) if w in err.message]
        if not found:
            raise
        raise Diverged(_diverged_message(found[0], checkpoint_dir)) from None
    except Diverged as err:
        raise Diverged(f"training diverged: {err}. {latest_text(checkpoint_dir)}") from None


def _diverged_message(what: str, checkpoint_dir: str | None) -> str:
    return (
        f"training diverged: {what} (NaN or infinite); the step was not applied. "
        f"{latest_text(checkpoint_dir)}. Lower optimizer.learning_rate, set "
        "optimizer.clip_norm, or set train.on_nonfinite: skip"
    )


def latest_text(checkpoint_dir: str | None) -> str:
    """What a run that stopped without saving leaves: the latest checkpoint, named."""
    if checkpoint_dir is None:  # not the chief, which may be on another machine
        return "The chief's latest checkpoint holds the last good weights"
    latest = tf.train.latest_checkpoint(checkpoint_dir) if checkpoint_dir else None
    return f"The latest checkpoint is {latest}" if latest else "No checkpoint was written"
