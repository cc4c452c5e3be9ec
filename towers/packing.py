"""Packed gradients: many small tensors exchanged as a few buffers.

Every exchange between processes has a fixed cost (a round of the ring per tensor,
a handshake per instance); a model of 65 small variables pays it 65 times a step.
`packed` wraps a reduction (a towers.GradientsFn) so that the dense tensors it is
handed travel concatenated, flat, in buffers of at most `max_bytes` each (a tensor
larger than that travels alone), and come back in their own shapes. The sum of a
concatenation is the concatenation of the sums, so the values are the same.
(Horovod's tensor fusion and tf_cnn_benchmarks' --gradient_repacking do the same.)

Sparse gradients (IndexedSlices) and None pass through unpacked: their rows differ
from process to process, so they cannot share a buffer of fixed layout.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf

GradientsFn = Callable[[list], list]


def pack_groups(values: list, max_bytes: int) -> list[list[int]]:
    """Indices of `values` to pack together, in order: dense tensors of one dtype and a
    fully known shape, each group at most max_bytes (one tensor alone may exceed it)."""
    groups: list[list[int]] = []
    open_group: dict[tf.DType, tuple[list[int], int]] = {}
    for index, value in enumerate(values):
        if not _packable(value):
            continue
        size = value.shape.num_elements() * value.dtype.size
        members, used = open_group.get(value.dtype, ([], 0))
        if members and used + size > max_bytes:
            members, used = [], 0
        if not members:
            groups.append(members)
        members.append(index)
        open_group[value.dtype] = (members, used + size)
    return groups


def _packable(value) -> bool:
    return (isinstance(value, tf.Tensor) and value.shape.is_fully_defined()
            and value.shape.num_elements() > 0)


def packed(reduce: GradientsFn, max_bytes: int) -> GradientsFn:
    """`reduce` with the dense values packed into buffers of at most max_bytes (0: as
    given, unpacked). Each buffer is a 1-D concatenation of its members, flat."""
    if max_bytes <= 0:
        return reduce

    def packed_reduce(values: list) -> list:
        groups = pack_groups(values, max_bytes)
        in_a_pack = {i for group in groups for i in group}
        alone = [i for i in range(len(values)) if i not in in_a_pack]
        with tf.name_scope("pack"):
            buffers = [tf.concat([tf.reshape(values[i], [-1]) for i in g], 0) for g in groups]
        reduced = reduce(buffers + [values[i] for i in alone])
        out = list(values)
        with tf.name_scope("unpack"):
            for group, buffer in zip(groups, reduced, strict=False):
                sizes = [int(np.prod(values[i].shape)) for i in group]
                for i, piece in zip(group, tf.split(buffer, sizes), strict=True):
                    out[i] = tf.reshape(piece, values[i].shape)
        for i, value in zip(alone, reduced[len(groups):], strict=True):
            out[i] = value
        return out

    return packed_reduce
