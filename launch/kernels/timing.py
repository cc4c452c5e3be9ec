"""Kernels timed alone, each in float32 and a 16-bit type, and what their times say.

A KernelTimer builds every kernel it is given, once per number type, in a graph of
its own (the operands random variables, so a run reads them and computes nothing
else), and times blocks: in each block every kernel runs once in every type, one
after the other, so a change of load falls on both types alike. Times are medians
over the blocks.

speedup() combines the kernels into one figure: the time the step's kernels take in
float32 over the time they take in the other type, each kernel counted as often as
the step runs it. That weighs each kernel's own speed-up by its share of the float32
time (a harmonic mean): what the whole step would gain if everything in it sped up
as its kernels do. It is the ceiling of a 16-bit step on this machine.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence

from launch.kernels.found import Kernel

Timings = dict[str, dict[str, float]]
"""Seconds of one run: {kernel.key: {number type: seconds}}."""

# A small kernel runs several times in a row per timed session run, so the run's own
# cost (a tenth of a millisecond) does not count as the kernel's: about this many
# FLOPs a run, at most MAX_REPEATS copies.
RUN_FLOPS = 2e8
MAX_REPEATS = 64


class KernelTimer:
    """`kernels` built in each of `number_types`, one session per type."""

    def __init__(self, kernels: Iterable[Kernel], number_types: Sequence[str]):
        import tensorflow as tf

        self.kernels = list(dict.fromkeys(kernels))
        self.number_types = list(number_types)
        self._runs: dict[str, tuple] = {}
        for number_type in self.number_types:
            graph = tf.Graph()
            with graph.as_default():
                dtype = tf.as_dtype(number_type)
                targets = [build_alone(kernel, dtype, repeats(kernel))
                           for kernel in self.kernels]
                init = tf.compat.v1.global_variables_initializer()
                graph.finalize()
            session = tf.compat.v1.Session(graph=graph)
            session.run(init)
            self._runs[number_type] = (session, targets)
        self._seconds: dict[tuple[int, str], list[float]] = {}

    def warm_up(self, deadline: float | None = None) -> bool:
        """Each kernel's first run in each type (oneDNN prepares a kernel on its first
        run), not timed; False if `deadline` (time.monotonic()) came first."""
        return self._each(lambda session, target: session.run(target), deadline)

    def time_block(self, deadline: float | None = None) -> bool:
        """One timed run of every kernel in every type; False if `deadline` came first
        (the kernels not reached keep the blocks they had)."""
        def timed(session, target) -> float:
            start = time.perf_counter()
            session.run(target)
            return (time.perf_counter() - start) / len(target)

        return self._each(timed, deadline, record=True)

    def _each(self, run, deadline: float | None, record: bool = False) -> bool:
        for i in range(len(self.kernels)):
            for number_type in self.number_types:
                if deadline is not None and time.monotonic() > deadline:
                    return False
                session, targets = self._runs[number_type]
                seconds = run(session, targets[i])
                if record:
                    self._seconds.setdefault((i, number_type), []).append(seconds)
        return True

    def timings(self) -> Timings:
        """The median seconds of every kernel timed in every type so far."""
        out: Timings = {}
        for (i, number_type), seconds in self._seconds.items():
            out.setdefault(self.kernels[i].key, {})[number_type] = statistics.median(seconds)
        return out

    def close(self) -> None:
        for session, _ in self._runs.values():
            session.close()


def speedup(counts: Mapping[Kernel, int], timings: Timings, number_type: str,
            part: str | None = None) -> float | None:
    """How much faster the kernels run in `number_type` than in float32, combined as
    the step runs them (`counts`: kernel -> runs a step); only kernels of `part`
    (FORWARD or GRADIENT) if given. None if no kernel was timed in both types."""
    base = other = 0.0
    for kernel, count in counts.items():
        times = timings.get(kernel.key, {})
        if (part is None or kernel.part == part) and "float32" in times and number_type in times:
            base += count * times["float32"]
            other += count * times[number_type]
    return base / other if other else None


def float32_seconds(counts: Mapping[Kernel, int], timings: Timings) -> float:
    """Seconds a step's kernels take in float32 (those timed)."""
    return sum(count * timings.get(kernel.key, {}).get("float32", 0.0)
               for kernel, count in counts.items())


def repeats(kernel: Kernel) -> int:
    """How many times in a row one timed run runs `kernel`."""
    return max(1, min(MAX_REPEATS, math.ceil(RUN_FLOPS / kernel.flops)))


def build_alone(kernel: Kernel, dtype, times: int = 1) -> list:
    """The kernel on random variables of `dtype`, `times` copies one after the other;
    returns them (run them as a session's targets: an op nothing reads, grouped, is
    pruned away)."""
    import tensorflow as tf

    operands = [tf.compat.v1.Variable(tf.cast(tf.random.uniform(shape, -1.0, 1.0), dtype))
                for shape in kernel.operands]
    values = [v.read_value() for v in operands]
    made = []
    for _ in range(times):
        with tf.control_dependencies(made[-1:]):
            made.append(_op(kernel, values))
    return made


def _op(kernel: Kernel, operands: list):
    import tensorflow as tf

    raw = tf.raw_ops
    attrs = {name: list(value) if isinstance(value, tuple) else value
             for name, value in kernel.attrs}
    sizes = tf.constant(kernel.output, tf.int32)
    if kernel.op == "Conv2D":
        out = raw.Conv2D(input=operands[0], filter=operands[1], **attrs)
    elif kernel.op == "Conv2DBackpropInput":
        out = raw.Conv2DBackpropInput(input_sizes=sizes, filter=operands[0],
                                      out_backprop=operands[1], **attrs)
    elif kernel.op == "Conv2DBackpropFilter":
        out = raw.Conv2DBackpropFilter(input=operands[0], filter_sizes=sizes,
                                       out_backprop=operands[1], **attrs)
    elif kernel.op == "MatMul":
        out = raw.MatMul(a=operands[0], b=operands[1], **attrs)
    else:  # BatchMatMulV2 and V3 compute alike; V2 takes one type for all
        out = raw.BatchMatMulV2(x=operands[0], y=operands[1], **attrs)
    return out.op
