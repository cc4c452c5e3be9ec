"""Split a global batch into one shard per tower, even or uneven, and the rule every
split obeys: each tower gets at least one example (an evaluation batch smaller than
that is padded to it: split_padded)."""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from towers.context import Features


class Shard(NamedTuple):
    """One tower's part of the global batch.

    features: same structure as the global features, leading dimension num_examples.
    labels: [num_examples, ...].
    num_examples: int32 scalar tensor.
    positions: int64 [num_examples], the examples' positions in the data (what keys
        their random draws, towers.example_random), when the batch came with them.
    """

    features: Features
    labels: tf.Tensor
    num_examples: tf.Tensor
    positions: tf.Tensor | None = None


def shard_sizes(batch_size: int, num_shards: int) -> list[int]:
    """Sizes differing by at most one, larger first: 10 over 4 gives [3, 3, 2, 2]."""
    base, extra = divmod(batch_size, num_shards)
    return [base + (1 if i < extra else 0) for i in range(num_shards)]


def batch_shortfall(batch_size: int, num_towers: int, micro_batches: int = 1,
                    processes: int = 1) -> str | None:
    """Why a global batch of `batch_size` examples leaves a tower without one, or None.

    Each of `processes` processes takes its shard of the global batch (shard_sizes),
    cuts it into `micro_batches` micro-batches and splits each across its `num_towers`
    towers. The smallest piece, floor(floor(floor(B / P) / k) / T), equals
    floor(B / (P * k * T)): every tower of every micro-batch in every process gets an
    example exactly when B >= P * T * k. The one wording of this rule, wherever a batch
    size is checked.
    """
    if batch_size >= processes * num_towers * micro_batches:
        return None
    return _cannot_give(f"a global batch of {batch_size} examples", num_towers, micro_batches,
                        processes)


def _cannot_give(batch: str, num_towers: int, micro_batches: int = 1,
                 processes: int = 1) -> str:
    towers = f"each of {num_towers} towers" if num_towers > 1 else "the one tower"
    if processes > 1:
        towers += f" in each of {processes} processes"
    example = "at least one example"
    if micro_batches > 1:
        example += f" of each of {micro_batches} micro-batches"
    needed = processes * num_towers * micro_batches
    return f"{batch} cannot give {towers} {example}; it needs at least {needed}"


def split_batch(features: Features, labels: tf.Tensor, num_shards: int) -> list[Shard]:
    """Split every tensor along axis 0 into num_shards shards of near-equal size.

    With a static batch size the sizes are Python ints and a batch smaller than
    num_shards fails here, at build time. With a dynamic one the same sizes are
    computed in the graph and the check runs with the step.
    """
    if num_shards < 1:
        raise ValueError(f"need at least one device, got {num_shards}")
    return _split(features, labels, num_shards, num_towers=num_shards)


def split_padded(features: Features, labels: tf.Tensor,
                 num_shards: int) -> tuple[list[Shard], list[tf.Tensor]]:
    """split_batch for evaluation, whose last batch may hold fewer examples than there
    are shards: a batch of B < num_shards examples is padded with copies of its first
    example to num_shards, one a shard, since a tower cannot compute on no examples
    (some TensorFlow kernels fail on an empty batch, and a mean over nothing is NaN).

    Returns the shards and each one's count of real examples, int32 scalars that
    shard_sizes(B, num_shards) gives: 0 for a shard holding only padding. The padding
    comes last, so the first B rows of the shards, concatenated, are the batch.
    """
    tensors = tf.nest.flatten(features) + [labels]
    batch_size = _static_batch_size(tensors)
    if batch_size is not None and batch_size >= num_shards:
        shards = split_batch(features, labels, num_shards)
        return shards, [s.num_examples for s in shards]
    if batch_size is not None:
        missing = num_shards - batch_size
        counts = [tf.constant(n, tf.int32) for n in shard_sizes(batch_size, num_shards)]
    else:
        real = tf.shape(labels)[0]
        missing = tf.maximum(num_shards - real, 0)
        counts = tf.unstack(_sizes_in_graph(real, num_shards), num=num_shards)
    padded = [tf.concat([t, tf.repeat(t[:1], missing, axis=0)], axis=0) for t in tensors]
    shards = split_batch(tf.nest.pack_sequence_as(features, padded[:-1]), padded[-1],
                         num_shards)
    return shards, counts


def split_micro_batches(features: Features, labels: tf.Tensor, num_towers: int,
                        micro_batches: int, positions: tf.Tensor | None = None
                        ) -> list[list[Shard]]:
    """The global batch as `micro_batches` consecutive micro-batches (sizes differing by
    at most one), each split across `num_towers` towers as split_batch splits a batch:
    splits[m][i] is tower i's shard of micro-batch m. The whole batch is checked once,
    against every tower of every micro-batch. positions: int64 [B], the examples'
    positions, split with them (Shard.positions)."""
    if positions is not None:
        splits = split_micro_batches((features, positions), labels, num_towers, micro_batches)
        return [[Shard(s.features[0], s.labels, s.num_examples, s.features[1]) for s in shards]
                for shards in splits]
    if micro_batches == 1:
        return [split_batch(features, labels, num_towers)]
    micro = _split(features, labels, micro_batches, num_towers, micro_batches)
    return [split_batch(m.features, m.labels, num_towers) for m in micro]


def _split(features: Features, labels: tf.Tensor, num_shards: int, num_towers: int,
           micro_batches: int = 1) -> list[Shard]:
    """num_shards shards, once the batch is known to give each of `num_towers` towers an
    example of each of `micro_batches` micro-batches (batch_shortfall)."""
    tensors = tf.nest.flatten(features) + [labels]
    batch_size = _static_batch_size(tensors)
    if batch_size is not None:
        shortfall = batch_shortfall(batch_size, num_towers, micro_batches)
        if shortfall:
            raise ValueError(shortfall)
        sizes = shard_sizes(batch_size, num_shards)
        counts = [tf.constant(n, tf.int32) for n in sizes]
    else:
        sizes = _dynamic_shard_sizes(tf.shape(labels)[0], num_shards, num_towers, micro_batches)
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


def _dynamic_shard_sizes(batch_size: tf.Tensor, num_shards: int, num_towers: int,
                         micro_batches: int) -> tf.Tensor:
    """The in-graph twin of shard_sizes: int32 [num_shards], with batch_shortfall's check
    run with the step."""
    # The message alone, with the batch's size in it: assert_greater_equal's would add
    # its own condition, tensor names and values.
    message = tf.strings.format(_cannot_give("a global batch of {} examples", num_towers,
                                             micro_batches), [batch_size])
    check = tf.debugging.Assert(batch_size >= num_towers * micro_batches, [message],
                                name="check_batch_size")
    with tf.control_dependencies([check]):
        return _sizes_in_graph(batch_size, num_shards)


def _sizes_in_graph(batch_size: tf.Tensor, num_shards: int) -> tf.Tensor:
    """shard_sizes computed in the graph: int32 [num_shards]."""
    base = batch_size // num_shards
    extra = batch_size % num_shards
    return base + tf.cast(tf.range(num_shards) < extra, tf.int32)
