"""Batch statistics over the whole global batch: synchronized batch normalization.

    build_train_op(..., batch_norm="sync")

With "local" (the default) each tower's batch norm normalizes with its own shard's
mean and variance. With "sync" every tower normalizes with the mean and variance of
the whole global batch, so N towers compute what one device computes on the whole
batch: forward outputs, loss, gradients (the backward pass runs through the shared
statistics) and moving statistics.

The towers of a step are built one after the other, so tower 0's batch norm cannot
see tower 1's activations when it is built. The towers therefore meet in collective
all-reduces (TensorFlow's CollectiveReduceV2, NCCL between GPUs): tower i's k-th
statistics sum is the same collective instance as every other tower's k-th, and
each waits for the others when the step runs. A model makes the same batch norms in
every tower (one function builds them all), so the k-th calls match.

Statistics are merged by example count in two passes: the sum of x (with the
element count) gives the global mean, then the sum of (x - mean)^2 the variance.
Sums of x and x^2 would need one all-reduce instead of two, but E[x^2] - E[x]^2
loses every digit when the mean is large against the spread; the two-pass sum is
as exact as one device's. Both passes run in float32 whatever the compute type.

The gradient of a sum across towers is the same sum of the upstream gradients (every
tower's loss depends on every tower's activations through the statistics), an
all-reduce of its own in the backward pass.
"""

from __future__ import annotations

import functools
import itertools
import weakref
from collections.abc import Callable, Sequence

import tensorflow as tf
from tensorflow.python.ops import collective_ops

BATCH_NORMS = ("local", "sync")

Sum = Callable[[tf.Tensor], tf.Tensor]
"""A float32 tensor summed over every tower of the step (and every process)."""

# Collective keys must be unique within a graph (one session's collective executor
# matches ops by them); a counter per graph, dropped with the graph.
_KEYS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def check_batch_norm(batch_norm: str) -> str:
    if batch_norm not in BATCH_NORMS:
        raise ValueError(f"batch_norm must be one of {', '.join(BATCH_NORMS)}; "
                         f"got {batch_norm!r}")
    return batch_norm


class CrossTowerSums:
    """Sums across the towers of one build (one step, or one micro-batch of it).

    devices: the towers' devices, tower i on devices[i].
    across_processes: a sum over the processes of a multi-process job (Horovod ranks),
        applied to this process's sum; None for a single process. Every process must
        run the same number of towers, so tower i's calls meet every rank's tower i.
    every_batch_norm: True with batch_norm="sync" (every batch norm uses the sums);
        False when only those that ask for it do (Keras' synchronized=True).
    """

    def __init__(self, devices: Sequence[str], across_processes: Sum | None = None,
                 every_batch_norm: bool = True):
        self.every_batch_norm = every_batch_norm
        self._devices = list(devices)
        self._across_processes = across_processes
        self._keys: list[tuple[int, int]] = []  # per call: forward and backward instance
        self._calls = [0] * len(devices)
        self._group_key = _group_key(tuple(self._devices))

    @property
    def used(self) -> bool:
        """Whether any tower has summed a statistic across the towers."""
        return any(self._calls)

    def for_tower(self, index: int) -> Sum:
        """The sum tower `index` calls; its k-th call meets every tower's k-th."""
        return functools.partial(self._sum, index)

    def _sum(self, index: int, value: tf.Tensor) -> tf.Tensor:
        call = self._calls[index]
        self._calls[index] += 1
        if call == len(self._keys):
            self._keys.append((_instance_key(), _instance_key()))
        forward, backward = self._keys[call]
        name = f"sync_{call}"

        @tf.custom_gradient
        def summed(x: tf.Tensor) -> tuple[tf.Tensor, Callable]:
            def grad(dy: tf.Tensor) -> tf.Tensor:
                return self._all_reduce(dy, backward, f"{name}_grad", index)

            return self._all_reduce(x, forward, name, index), grad

        return summed(value)

    def _all_reduce(self, value: tf.Tensor, instance_key: int, name: str,
                    index: int) -> tf.Tensor:
        if len(self._devices) > 1:
            value = collective_ops.all_reduce_v2(
                value, group_size=len(self._devices), group_key=self._group_key,
                instance_key=instance_key, merge_op="Add", final_op="Id")
        if self._across_processes is not None:
            with tf.name_scope(f"tower_{index}_{name}"):
                value = self._across_processes(value)
        return value


def moments(x: tf.Tensor, axes: Sequence[int],
            total: Sum | None = None) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Mean and (biased) variance of x over `axes`, and the count they are over.

    x: [batch, ..., channels] in any float type; axes: every axis but the channels.
    total: sums across the towers (CrossTowerSums.for_tower); None: this tensor alone.
    Returns float32 mean [channels], variance [channels] and count (a scalar): with
    `total`, over the whole global batch.
    """
    x = tf.cast(x, tf.float32)
    total = total or tf.identity
    count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), list(axes))), tf.float32)
    # One all-reduce carries the count with the sums: [count, sum over axes...].
    sums = total(tf.concat([count[None], tf.reduce_sum(x, axes)], axis=0))
    count = tf.stop_gradient(sums[0])
    mean = sums[1:] / count
    variance = total(tf.reduce_sum(tf.math.squared_difference(x, mean), axes)) / count
    return mean, variance, count


def _group_key(devices: tuple[str, ...]) -> int:
    """One collective group per device set: a group's key fixes its members."""
    graph = tf.compat.v1.get_default_graph()
    keys = _KEYS.setdefault(graph, {"instance": itertools.count(1), "groups": {}})
    return keys["groups"].setdefault(devices, len(keys["groups"]) + 1)


def _instance_key() -> int:
    graph = tf.compat.v1.get_default_graph()
    keys = _KEYS.setdefault(graph, {"instance": itertools.count(1), "groups": {}})
    return next(keys["instance"])
