"""TensorFlow's collective ops between the processes of a job that has no ps tasks.

Every process (worker) keeps a full copy of the variables; each step its summed
gradients, loss and metrics are all-reduced across the workers with the collective
ops the gRPC servers already run (a ring on CPUs, NCCL between GPUs), so every
worker applies the same update. Pure graph construction, like the rest of the
package: the launcher's session config names the group leader.

A collective op is matched across processes by (group key, instance key): every
worker builds the same graph in the same order, so a counter per group gives each
op the same instance key in every worker. All of a group's ops run on one device per
worker (`device`), which is what makes the group.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import tensorflow as tf
from tensorflow.python.ops import collective_ops

from towers.placement import device_type

# Collective ops of a job use this group; the key only needs to be the same everywhere.
GROUP_KEY = 1


@dataclass
class CollectiveGroup:
    """One collective device per worker: `size` workers, this one's `device`.

    timeout_secs: how long a collective waits for its peers (0: for ever; the step's
    own deadline then bounds it).
    """

    size: int
    device: str
    timeout_secs: float = 0.0
    _next_key: int = field(default=1, repr=False)

    @property
    def communication(self) -> str:
        """NCCL between GPUs; TensorFlow's ring elsewhere (its only CPU implementation)."""
        return "nccl" if device_type(self.device) == "GPU" else "ring"

    def instance_key(self) -> int:
        key = self._next_key
        self._next_key += 1
        return key

    def all_reduce_sum(self, tensor: tf.Tensor) -> tf.Tensor:
        """The sum of `tensor` over every worker (same shape and type on each)."""
        return collective_ops.all_reduce(
            tensor, self.size, GROUP_KEY, self.instance_key(), "Add", "Id",
            communication_hint=self.communication, timeout=self.timeout_secs)

    def all_gather(self, tensor: tf.Tensor) -> tf.Tensor:
        """[size * n, ...]: every worker's [n, ...] tensor (same n everywhere), worker
        order."""
        return collective_ops.all_gather(
            tensor, self.size, GROUP_KEY, self.instance_key(),
            communication_hint=self.communication, timeout=self.timeout_secs)

    def broadcast(self, tensor: tf.Tensor) -> tf.Tensor:
        """Sends this (the source) worker's `tensor` to every other worker's `receive`."""
        return collective_ops.broadcast_send(
            tensor, tensor.shape, tensor.dtype, self.size, GROUP_KEY, self.instance_key(),
            communication_hint=self.communication, timeout=self.timeout_secs)

    def receive(self, shape: tf.TensorShape, dtype: tf.DType) -> tf.Tensor:
        """What the source worker's matching `broadcast` sends."""
        return collective_ops.broadcast_recv(
            shape, dtype, self.size, GROUP_KEY, self.instance_key(),
            communication_hint=self.communication, timeout=self.timeout_secs)


def weighted_all_reduce(group: CollectiveGroup, share: float):
    """A towers.GradientsFn: every worker's values weighted by its share of the global
    batch (its examples / the global batch) and summed, on the group's device.

    Each worker's towers give the gradient of the mean loss over its own examples;
    weighted by share and summed, that is the gradient of the mean over the global
    batch, also when the workers' shares differ. Sparse gradients (IndexedSlices)
    stay sparse: their rows are gathered from every worker (a dense sum would make
    momentum move rows no worker's batch touched).
    """

    def reduce(values: list) -> list:
        with tf.device(group.device), tf.name_scope("collective_all_reduce"):
            return [None if v is None else _reduce_one(group, v, share) for v in values]

    return reduce


def _reduce_one(group: CollectiveGroup, value, share: float):
    if isinstance(value, tf.IndexedSlices):
        return gather_slices(group, _scaled(value, share))
    return group.all_reduce_sum(_scaled(value, share))


def _scaled(value, share: float):
    if isinstance(value, tf.IndexedSlices):
        values = value.values * tf.cast(share, value.values.dtype)
        return tf.IndexedSlices(values, value.indices, value.dense_shape)
    return value * tf.cast(share, value.dtype)


def gather_slices(group: CollectiveGroup, slices: tf.IndexedSlices) -> tf.IndexedSlices:
    """Every worker's rows, [sum of rows, ...]. The collective gather needs one shape on
    every worker, so each pads its rows to the longest worker's count, and the padding
    is dropped after (a padded row would count as a row present in the batch)."""
    rows = tf.shape(slices.indices, out_type=tf.int64)[0]
    counts = group.all_gather(tf.reshape(rows, [1]))  # [size]
    longest = tf.reduce_max(counts)
    pad = longest - rows
    values = tf.pad(slices.values, [[0, pad]] + [[0, 0]] * (slices.values.shape.rank - 1))
    indices = tf.pad(tf.cast(slices.indices, tf.int64), [[0, pad]])
    keep = tf.reshape(tf.sequence_mask(counts, longest), [-1])  # [size * longest]
    gathered_values = tf.boolean_mask(group.all_gather(values), keep)
    gathered_indices = tf.boolean_mask(group.all_gather(indices), keep)
    return tf.IndexedSlices(gathered_values, tf.cast(gathered_indices, slices.indices.dtype),
                            slices.dense_shape)


def broadcast_variables(group: CollectiveGroup, variables: list[tf.Variable],
                        is_source: bool) -> tf.Operation:
    """An op that gives every worker the source worker's value of each variable (run
    by every worker at once, e.g. after the source has restored a checkpoint)."""
    done = []
    with tf.name_scope("collective_broadcast"):
        for var in variables:
            if is_source:
                with tf.device(var.device):
                    value = var.read_value()
                with tf.device(group.device):
                    done.append(group.broadcast(value).op)
                continue
            with tf.device(group.device):
                received = group.receive(var.shape, var.dtype.base_dtype)
            with tf.device(var.device):
                done.append(var.assign(received, read_value=False))
    return tf.group(*done)
