"""Batch statistics over the whole global batch: synchronized batch normalization.

    build_train_op(..., batch_norm="sync")

With "local" (the default) each tower's batch norm normalizes with its own shard's
mean and variance. With "sync" every tower normalizes with the mean and variance of
the whole global batch, so N towers compute what one device computes on the whole
batch: forward outputs, loss, gradients (the backward pass runs through the shared
statistics) and moving statistics.

The towers of a step are built one after the other, so tower 0's batch norm cannot
see tower 1's activations when it is built. The towers therefore meet in collective
ops (TensorFlow's CollectiveGatherV2 and CollectiveReduceV2, NCCL between GPUs):
tower i's k-th statistics call is the same collective instance as every other
tower's k-th, and each waits for the others when the step runs. A model makes the
same batch norms in every tower (one function builds them all), so the k-th calls
match.

One collective per batch norm forward, one backward (each is a wait for the slowest
tower, which is what synchronization costs):

  forward   each tower's [count, mean, M2] (M2: the sum of squared deviations from
            its own mean, by the fused batch-norm kernel's two passes, as one device
            computes them) gathered from every tower, then merged exactly (Chan et
            al.'s parallel variance: the merged M2 is the towers' M2s plus each count
            times its mean's squared distance from the global mean). Sums of x and
            x^2 would cost the same, but E[x^2] - E[x]^2 loses every digit when the
            mean is large against the spread; the merge is as exact as one device.
  backward  the gradient of the global mean and variance with respect to this tower's
            x needs the sums over every tower of the upstream gradients of both:
            one all-reduce of the two packed together, then one pass over x.

Across processes (Horovod ranks) the merged statistics go through one more sum, of
[n, n mean, M2 + n mean^2] in float64 (a sum, not a gather, so that a plain
all-reduce is all a process needs; exact to float32 while the mean is within 10^4
standard deviations of 0), and the backward's sums through one more sum. Statistics
are float32 whatever the compute type, except of float64 values (towers verify's
precision), which keep float64 throughout (the fused kernel has no float64: plain
ops, the same two passes).
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Sequence

import tensorflow as tf
from tensorflow.python.ops import collective_ops

from towers.custom_gradient import custom_gradient

BATCH_NORMS = ("local", "sync")

Sum = Callable[[tf.Tensor], tf.Tensor]
"""A float32 or float64 tensor summed over every process (an all-reduce sum)."""

# Collective keys must be unique within a graph (one session's collective executor
# matches ops by them); a counter per graph, dropped with the graph.
_KEYS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def check_batch_norm(batch_norm: str) -> str:
    if batch_norm not in BATCH_NORMS:
        raise ValueError(f"batch_norm must be one of {', '.join(BATCH_NORMS)}; "
                         f"got {batch_norm!r}")
    return batch_norm


class CrossTowerSums:
    """The statistics across the towers of one build (one step, or one micro-batch).

    devices: the towers' devices, tower i on devices[i].
    across_processes: a sum over the processes of a multi-process job (Horovod ranks),
        applied to what this process's towers have combined; None for a single
        process. Every process must run the same number of towers, so tower i's calls
        meet every rank's tower i.
    every_batch_norm: True with batch_norm="sync" (every batch norm uses the sums);
        False when only those that ask for it do (Keras' synchronized=True).
    """

    def __init__(self, devices: Sequence[str], across_processes: Sum | None = None,
                 every_batch_norm: bool = True):
        self.every_batch_norm = every_batch_norm
        self._devices = list(devices)
        self._sum_processes = across_processes
        self._keys: list[tuple[int, int]] = []  # per call: forward and backward instance
        self._calls = [0] * len(devices)
        self._group_key = _group_key(tuple(self._devices))

    @property
    def used(self) -> bool:
        """Whether any tower has combined a statistic across the towers."""
        return any(self._calls)

    @property
    def statistics(self) -> int:
        """How many statistics (batch norms) tower 0 has combined across the towers."""
        return self._calls[0]

    def for_tower(self, index: int) -> TowerSums:
        """What tower `index` calls; its k-th call meets every tower's k-th."""
        return TowerSums(self, index)

    def _next_keys(self, index: int) -> tuple[int, int, str]:
        """The forward and backward instance keys of tower `index`'s next call, and a
        name for its ops."""
        call = self._calls[index]
        self._calls[index] += 1
        if call == len(self._keys):
            self._keys.append((_instance_key(), _instance_key()))
        return (*self._keys[call], f"sync_{call}")

    def _sum(self, value: tf.Tensor, instance_key: int, name: str, index: int) -> tf.Tensor:
        """value summed over the towers, then the processes."""
        if len(self._devices) > 1:
            value = collective_ops.all_reduce_v2(
                value, group_size=len(self._devices), group_key=self._group_key,
                instance_key=instance_key, merge_op="Add", final_op="Id")
        if self._sum_processes is not None:
            with tf.name_scope(f"tower_{index}_{name}"):
                value = self._sum_processes(value)
        return value

    def _combine(self, count: tf.Tensor, mean: tf.Tensor, m2: tf.Tensor, instance_key: int,
                 name: str, index: int) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """This tower's count, mean and M2 combined with every tower's (gathered, then
        merged exactly), then with every process's."""
        row = tf.concat([count[None], mean, m2], axis=0)
        if len(self._devices) > 1:
            rows = collective_ops.all_gather_v2(
                row[None], group_size=len(self._devices), group_key=self._group_key,
                instance_key=instance_key)
            count, mean, m2 = _merge(rows, mean.shape[0])
        if self._sum_processes is not None:
            with tf.name_scope(f"tower_{index}_{name}"):
                count, mean, m2 = _sum_over_processes(count, mean, m2, self._sum_processes)
        return count, mean, m2


class TowerSums:
    """One tower's handle on the statistics across the towers (TowerContext.batch_sum).

    Called with a float32 tensor, it returns its sum over every tower of the step (and
    every process), with that sum's gradient: one all-reduce each way.
    moments(x): the mean and variance of the whole global batch (one gather forward,
    one all-reduce backward).
    """

    def __init__(self, sums: CrossTowerSums, index: int):
        self._sums = sums
        self._index = index

    def __call__(self, value: tf.Tensor) -> tf.Tensor:
        forward, backward, name = self._sums._next_keys(self._index)

        @custom_gradient
        def summed(x: tf.Tensor) -> tuple[tf.Tensor, Callable]:
            def grad(dy: tf.Tensor) -> tf.Tensor:
                return self._sums._sum(dy, backward, f"{name}_grad", self._index)

            return self._sums._sum(x, forward, name, self._index), grad

        return summed(value)

    def moments(self, x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """The float32 mean [c] and biased variance [c] of x [..., c] (any float type)
        over every axis but the last, across every tower, and the element count."""
        forward, backward, name = self._sums._next_keys(self._index)
        sums, index = self._sums, self._index
        return _merged_moments(
            x, lambda *moments: sums._combine(*moments, forward, name, index),
            lambda value: sums._sum(value, backward, f"{name}_grad", index))


def moments(x: tf.Tensor, axes: Sequence[int],
            total: TowerSums | None = None) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Mean and (biased) variance of x over `axes`, and the count they are over.

    x: [batch, ..., channels] in any float type; axes: every axis but the channels.
    total: the tower's statistics across the towers (CrossTowerSums.for_tower); None:
    this tensor alone.
    Returns float32 mean [channels], variance [channels] and count (a scalar): with
    `total`, over the whole global batch.
    """
    rank = x.shape.rank
    if rank is None or sorted(a % rank for a in axes) != list(range(rank - 1)) \
            or x.shape[-1] is None:
        raise ValueError(f"batch statistics are over every axis but the last (channels "
                         f"last, a static size); got axes {list(axes)} of shape {x.shape}")
    if total is not None:
        return total.moments(x)
    return _merged_moments(x, lambda *moments: moments, tf.identity)


Moments = tuple[tf.Tensor, tf.Tensor, tf.Tensor]


def _merged_moments(x: tf.Tensor, combine: Callable[..., Moments],
                    sum_: Callable[[tf.Tensor], tf.Tensor]) -> Moments:
    """The mean, biased variance and count of x [..., c] over every part: combine(count,
    mean [c], M2 [c]) of this part gives every part's; sum_: a [2c] tensor summed over
    the parts (the backward pass)."""

    @custom_gradient
    def merged(x: tf.Tensor) -> tuple[tuple[tf.Tensor, ...], Callable]:
        total, mean, m2 = combine(*_own_moments(x))
        variance = m2 / total

        def grad(dmean, dvariance, _dcount) -> tf.Tensor:
            # d(mean)/dx = 1 / n and d(variance)/dx = 2 (x - mean) / n, n the count of
            # every part, whose upstream gradients all count: one sum of both.
            both = tf.concat([_zeros_if_none(dmean, mean),
                              _zeros_if_none(dvariance, variance)], axis=0)
            dmean, dvariance = tf.split(sum_(both), 2)
            return _affine(x, mean, 2.0 * dvariance / total, dmean / total)

        return (mean, variance, total), grad

    return merged(x)


def _own_moments(x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """x's element count per channel (a float32 scalar), mean [c] and sum of squared
    deviations from it [c], by the fused batch-norm kernel: in float32 whatever x's
    type, in two passes, as one device's batch norm computes them (its normalized
    output goes unused)."""
    channels = x.shape[-1]
    dtype = tf.float64 if x.dtype == tf.float64 else tf.float32
    if x.shape[:-1].is_fully_defined():
        count = tf.constant(float(x.shape[:-1].num_elements()), dtype)
    else:
        count = tf.cast(tf.reduce_prod(tf.shape(x)[:-1]), dtype)
    if dtype == tf.float64:
        axes = list(range(x.shape.rank - 1))
        mean = tf.reduce_mean(x, axes)
        return count, mean, tf.reduce_sum(tf.square(x - mean), axes)
    empty = tf.constant([], tf.float32)
    _, mean, corrected, _, _, _ = tf.raw_ops.FusedBatchNormV3(
        x=_as_4d(x), scale=tf.ones([channels]), offset=tf.zeros([channels]), mean=empty,
        variance=empty, is_training=True)
    # The kernel's variance has Bessel's correction, n / (n - 1) (1 for a single value).
    return count, mean, corrected * tf.maximum(count - 1.0, 1.0)


def _affine(x: tf.Tensor, mean: tf.Tensor, scale: tf.Tensor, offset: tf.Tensor) -> tf.Tensor:
    """(x - mean) * scale + offset, per channel [c] of x [..., c], in one pass over x
    (three in plain ops): the fused batch-norm kernel in inference mode computes
    (x - mean) * scale / sqrt(variance + epsilon) + offset, here with variance 0 and
    epsilon 1. float64 x: in plain ops (the kernel has no float64)."""
    if x.dtype == tf.float64:
        return (x - mean) * scale + offset
    y, *_ = tf.raw_ops.FusedBatchNormV3(
        x=_as_4d(x), scale=scale, offset=offset, mean=mean, variance=tf.zeros_like(mean),
        epsilon=1.0, is_training=False)
    return y if x.shape.rank == 4 else tf.reshape(y, tf.shape(x))


def _as_4d(x: tf.Tensor) -> tf.Tensor:
    """x [..., c] as the fused kernel takes it, [n, h, w, c] (a view: [-1, 1, 1, c])."""
    return x if x.shape.rank == 4 else tf.reshape(x, [-1, 1, 1, x.shape[-1]])


def _merge(rows: tf.Tensor, channels: int) -> Moments:
    """Rows [count, mean [c], M2 [c]] of every part merged exactly (Chan et al.): the
    total count, the mean and the M2 of them all."""
    counts = rows[:, :1]
    means, m2s = rows[:, 1:1 + channels], rows[:, 1 + channels:]
    total = tf.reduce_sum(counts)
    mean = tf.reduce_sum(counts * means, axis=0) / total
    m2 = tf.reduce_sum(m2s, axis=0) + tf.reduce_sum(counts * tf.square(means - mean), axis=0)
    return total, mean, m2


def _sum_over_processes(count: tf.Tensor, mean: tf.Tensor, m2: tf.Tensor,
                        sum_processes: Sum) -> Moments:
    """A process's count, mean and M2 combined with every process's through one sum of
    [n, n mean, M2 + n mean^2] in float64: the processes share no value to shift by,
    and float64 keeps the variance's float32 digits while the mean is within 10^4
    standard deviations of 0 (S2 - n mean^2 cancels about 2 log10(mean / std) of
    float64's 16 digits)."""
    n, mean64, m2_64 = (tf.cast(t, tf.float64) for t in (count, mean, m2))
    summed = sum_processes(tf.concat([n[None], n * mean64, m2_64 + n * tf.square(mean64)], 0))
    total = summed[0]
    mean64 = summed[1:1 + mean.shape[0]] / total
    m2_64 = summed[1 + mean.shape[0]:] - total * tf.square(mean64)
    return tuple(tf.cast(t, mean.dtype) for t in (total, mean64, m2_64))


def _zeros_if_none(grad: tf.Tensor | None, like: tf.Tensor) -> tf.Tensor:
    return tf.zeros_like(like) if grad is None else grad


def _group_key(devices: tuple[str, ...]) -> int:
    """One collective group per device set: a group's key fixes its members."""
    graph = tf.compat.v1.get_default_graph()
    keys = _KEYS.setdefault(graph, {"instance": itertools.count(1), "groups": {}})
    return keys["groups"].setdefault(devices, len(keys["groups"]) + 1)


def _instance_key() -> int:
    graph = tf.compat.v1.get_default_graph()
    keys = _KEYS.setdefault(graph, {"instance": itertools.count(1), "groups": {}})
    return next(keys["instance"])
