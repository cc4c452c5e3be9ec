"""Packed gradients: many small tensors exchanged as a few buffers.

Every exchange between processes has a fixed cost (a round of the ring per tensor,
a handshake per instance); a model of 65 small variables pays it 65 times a step.
`packed` wraps a reduction (a towers.GradientsFn) so that the dense tensors it is
handed travel concatenated, flat, in buffers of at most `max_bytes` each (a tensor
larger than that travels alone), and come back in their own shapes. The sum of a
concatenation is the concatenation of the sums, so the values are the same.
(Horovod's tensor fusion and tf_cnn_benchmarks' --gradient_repacking do the same.)

`packed_send` does the same for a one-way move: a worker's summed gradients on their
way to the ps tasks travel as one buffer per ps task (and at most max_bytes), split
back into the variables' shapes on the task that holds them. Only when asked
(ParameterServer(pack_bytes=...)): measured, it slowed the push down (a buffer waits
for the last gradient; see towers.resolve_variable_update).

Sparse gradients (IndexedSlices) and None pass through unpacked: their rows differ
from process to process, so they cannot share a buffer of fixed layout.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf

from towers.placement import same_device

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


def packed_send(grads: list, variables: list, source: str, max_bytes: int) -> list:
    """grads[j], each [*variables[j].shape] (or IndexedSlices, or None), on `source`,
    moved to variables[j]'s device: packed per destination device in buffers of at most
    max_bytes (0: each tensor on its own, as given). The concatenation runs on source,
    the split on the destination, so one tensor per buffer crosses between them; the
    values are the same. Gradients whose variable is on source itself stay as given
    (there is no move to save)."""
    if max_bytes <= 0:
        return list(grads)
    by_device: dict[str, list[int]] = {}
    for j, var in enumerate(variables):
        if not same_device(var.device, source):
            by_device.setdefault(var.device, []).append(j)
    out = list(grads)
    for device, members in by_device.items():
        for group in pack_groups([grads[j] for j in members], max_bytes):
            indices = [members[i] for i in group]
            with tf.device(source), tf.name_scope("pack"):
                buffer = _flat_concat([grads[j] for j in indices])
            with tf.device(device), tf.name_scope("unpack"):
                for j, piece in zip(indices, _split_like(buffer, [grads[j] for j in indices]),
                                    strict=True):
                    out[j] = piece
    return out


def _flat_concat(values: list) -> tf.Tensor:
    """[sum of sizes]: the values flattened and concatenated, in order."""
    return tf.concat([tf.reshape(v, [-1]) for v in values], 0)


def _split_like(buffer: tf.Tensor, values: list) -> list[tf.Tensor]:
    """A buffer of _flat_concat(values) split back into the values' shapes."""
    sizes = [int(np.prod(v.shape)) for v in values]
    return [tf.reshape(piece, v.shape)
            for piece, v in zip(tf.split(buffer, sizes), values, strict=True)]


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
            buffers = [_flat_concat([values[i] for i in g]) for g in groups]
        reduced = reduce(buffers + [values[i] for i in alone])
        out = list(values)
        with tf.name_scope("unpack"):
            for group, buffer in zip(groups, reduced, strict=False):
                pieces = _split_like(buffer, [values[i] for i in group])
                for i, piece in zip(group, pieces, strict=True):
                    out[i] = piece
        for i, value in zip(alone, reduced[len(groups):], strict=True):
            out[i] = value
        return out

    return packed_reduce
