"""The distance to the machine's limit: FLOPs a step does, and what this machine peaks at.

  step_flops   floating-point operations of one training step, counted from the built
               graph by TensorFlow's profiler (tf.compat.v1.profiler, the registered
               statistics of MatMul, Conv2D and their gradients, element-wise ops ...)
               over the ops the train op runs
  Peak         a large square matmul in one number type, timed in blocks between the
               rounds of rows, so the peak is measured in the same run and under the
               same load; it runs in the bench's own process, which only waits while
               the rows' processes step
  number_type_notes  whether this CPU does bfloat16 / float16 arithmetic in hardware
               (its flags, launch.devices.native_flags), or TensorFlow emulates it

Achieved FLOP/s (examples/sec x FLOPs per example) over the peak of the row's number
type is how far a row is from what this machine can do.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Collection

PEAK_SIZE = 2048  # n of the n x n matmul: 2 n^3 = 17 GFLOP, large enough to run at peak
PEAK_MATMULS = 2  # per timed block


def step_flops(graph, train_op) -> int:
    """FLOPs of one run of `train_op` in `graph` (static shapes), by the profiler."""
    import tensorflow as tf

    from launch.kernels import ops_run_by

    v1 = tf.compat.v1
    needed = {op.name for op in ops_run_by(train_op)}
    options = v1.profiler.ProfileOptionBuilder.float_operation()
    options["output"] = "none"
    with _quiet_profiler():
        profile = v1.profiler.profile(graph, options=options)
    total = 0
    todo = [profile]
    while todo:
        node = todo.pop()
        if node.name in needed:
            total += node.float_ops
        todo.extend(node.children)
    return total


def _quiet_profiler():
    """The profiler logs a deprecation warning per call; it says nothing a user can act on."""
    import contextlib
    import logging

    @contextlib.contextmanager
    def quiet():
        logger = logging.getLogger("tensorflow")
        level = logger.level
        logger.setLevel(logging.ERROR)
        try:
            yield
        finally:
            logger.setLevel(level)

    return quiet()


class PeakRun:
    """A PEAK_SIZE matmul of `number_type` in a session; run(n) does n of them."""

    def __init__(self, number_type: str):
        import tensorflow as tf

        graph = tf.Graph()
        with graph.as_default():
            dtype = tf.as_dtype(number_type)
            a = tf.compat.v1.Variable(tf.cast(tf.random.normal([PEAK_SIZE] * 2), dtype))
            b = tf.compat.v1.Variable(tf.cast(tf.random.normal([PEAK_SIZE] * 2), dtype))
            self._product = tf.matmul(a, b).op  # run as a target: nothing is copied out
            init = tf.compat.v1.global_variables_initializer()
            graph.finalize()
        self._session = tf.compat.v1.Session(graph=graph)
        self._session.run(init)
        self.flops_per_run = 2 * PEAK_SIZE**3

    def run(self, matmuls: int) -> None:
        for _ in range(matmuls):
            self._session.run(self._product)

    def close(self) -> None:
        self._session.close()


class Peak:
    """The peak matmul of one number type and its FLOP/s in each timed block."""

    def __init__(self, number_type: str):
        self.number_type = number_type
        self.rates: list[float] = []
        self._run = PeakRun(number_type)
        self._run.run(1)  # warm-up, as the rows have theirs

    def time_block(self) -> None:
        start = time.perf_counter()
        self._run.run(PEAK_MATMULS)
        self.rates.append(PEAK_MATMULS * self._run.flops_per_run / (time.perf_counter() - start))

    @property
    def median(self) -> float | None:
        return statistics.median(self.rates) if self.rates else None

    def close(self) -> None:
        self._run.close()


def number_type_notes(number_types: list[str],
                      flags: Collection[str] | None = None) -> dict[str, str]:
    """{number type: 'native (avx512_bf16)' or 'emulated: ...'} for the 16-bit types used,
    on a CPU with `flags` (default: this one's)."""
    # Here, not at the top: every `towers` command imports the bench to build its
    # parser, and launch.devices imports TensorFlow.
    from launch.devices import NATIVE_FLAGS, native_flags

    notes = {}
    for number_type in number_types:
        if number_type not in NATIVE_FLAGS:
            continue
        found = native_flags(number_type, flags)
        notes[number_type] = (
            f"native ({', '.join(found)})" if found else
            f"emulated: this CPU has none of {', '.join(NATIVE_FLAGS[number_type])}, so "
            f"TensorFlow converts to float32 and back; its rows' ratios carry no speed goal")
    return notes
