"""Keras' BatchNormalization(synchronized=True) across the towers of a step.

Keras synchronizes a batch norm through `tf.distribute`'s replica context, which a
graph of towers does not have (its default context sums over one replica: nothing).
While a tower with synchronized batch norm is built, Keras' TensorFlow backend
computes synchronized moments with towers.batch_stats instead, so such a layer
normalizes with the whole global batch's statistics like the built-in batch norm.
Keras offers no public hook for this: the one replaced is
`keras.src.backend.tensorflow.nn._compute_moments_sync`, the function its `moments`
calls for `synchronized=True` and for nothing else. A plain BatchNormalization
(synchronized=False) keeps its own tower's statistics, as Keras defines it.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence

import tensorflow as tf

from towers import batch_stats
from towers.batch_stats import TowerSums

_BACKEND = "keras.src.backend.tensorflow.nn"


@contextlib.contextmanager
def synchronized_moments(batch_sum: TowerSums | None) -> Iterator[None]:
    """Inside, Keras' synchronized moments sum over the towers with `batch_sum`; None,
    or Keras not imported (only a model that imported it makes Keras layers): no change."""
    backend = sys.modules.get(_BACKEND)
    if batch_sum is None or backend is None or not hasattr(backend, "_compute_moments_sync"):
        yield
        return
    before = backend._compute_moments_sync

    def moments(x: tf.Tensor, axes: Sequence[int], keepdims: bool) -> tuple:
        """Keras' signature: x float32 (Keras casts 16-bit inputs first); the mean and
        biased variance over axes, those axes kept as 1s when keepdims."""
        mean, variance, _ = batch_stats.moments(x, axes, batch_sum)
        if keepdims:
            shape = [1 if a in _positive(axes, x.shape.rank) else -1 for a in range(x.shape.rank)]
            mean, variance = tf.reshape(mean, shape), tf.reshape(variance, shape)
        return tf.cast(mean, x.dtype), tf.cast(variance, x.dtype)

    backend._compute_moments_sync = moments
    try:
        yield
    finally:
        backend._compute_moments_sync = before


def _positive(axes: Sequence[int], rank: int) -> set[int]:
    return {a % rank for a in axes}
