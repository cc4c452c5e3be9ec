"""Split a global batch into one shard per tower, even or uneven."""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from towers.context import Features


class Shard(NamedTuple):
    """One tower's part of the global batch.

    features: same structure as the global features, leading dimension num_examples.
    labels: [num_examples, ...].
    num_examples: int32 scalar tensor.
    """

    features: Features
    labels: tf.Tensor
    num_examples: tf.Tensor


def shard_sizes(batch_size: int, num_shards: int) -> list[int]:
    """Sizes differing by at most one, larger first: 10 over 4 gives [3, 3, 2, 2]."""
    base, extra = divmod(batch_size, num_shards)
    return [base + (1 if i < extra else 0) for i in range(num_shards)]


def split_batch(features: Features, labels: tf.Tensor, num_shards: int) -> list[Shard]:
    """Split every tensor along axis 0 into num_shards shards of near-equal size.

    With a static batch size the sizes are Python ints and a batch smaller than
    num_shards fails here, at build time. With a dynamic one the same sizes are
    computed in the graph and the check runs with the step.
    """
    if num_shards < 1:
        raise ValueError(f"need at least one device, got {num_shards}")
    tensors = tf.nest.flatten(features) + [labels]
    batch_size = _static_batch_size(tensors)
    if batch_size is not None:
        if batch_size < num_shards:
            raise ValueError(
                f"global batch of {batch_size} examples cannot be split across {num_shards} "
                f"towers: every tower needs at least one example"
            )
        sizes = shard_sizes(batch_size, num_shards)
        counts = [tf.constant(n, tf.int32) for n in sizes]
    else:
        sizes = _dynamic_shard_sizes(tf.shape(labels)[0], num_shards)
        counts = tf.unstack(sizes, num=num_shards)
    pieces = [tf.split(t, sizes, axis=0, num=num_shards) for t in tensors]
    shards = []
    for i in range(num_shards):
        flat = [p[i] for p in pieces]
        shard_features = tf.nest.pack_sequence_as(features, flat[:-1])
        shards.append(Shard(shard_features, flat[-1], counts[i]))
    return shards


def _static_batch_size(tensors: list[tf.Tensor]) -> int | None:
    """The leading dimension shared by all tensors, or None when unknown until run time."""
    known = {int(t.shape[0]) for t in tensors if t.shape.rank and t.shape[0] is not None}
    if any(t.shape.rank == 0 for t in tensors):
        raise ValueError("features and labels need a leading batch dimension; got a scalar")
    if len(known) > 1:
        raise ValueError(f"features and labels disagree on the batch size: {sorted(known)}")
    if known and all(t.shape[0] is not None for t in tensors):
        return known.pop()
    return None


def _dynamic_shard_sizes(batch_size: tf.Tensor, num_shards: int) -> tf.Tensor:
    """The in-graph twin of shard_sizes: int32 [num_shards], with a run-time size check."""
    check = tf.debugging.assert_greater_equal(
        batch_size,
        num_shards,
        message=f"global batch is smaller than the number of towers ({num_shards})",
    )
    with tf.control_dependencies([check]):
        base = batch_size // num_shards
        extra = batch_size % num_shards
    return base + tf.cast(tf.range(num_shards) < extra, tf.int32)
