"""Keras' BatchNormalization across the towers of a step.

Keras synchronizes a batch norm through `tf.distribute`'s replica context, which a
graph of towers does not have (its default context sums over one replica: nothing).
While a tower is built, Keras' TensorFlow backend computes synchronized moments with
towers.batch_stats instead, so such a layer normalizes with the whole global batch's
statistics like the built-in batch norm. Keras offers no public hook for this: the one
replaced is `keras.src.backend.tensorflow.nn._compute_moments_sync`, the function its
`moments` calls for `synchronized=True` and for nothing else.

Which layers synchronize: those made with `synchronized=True`, always; with
batch_norm="sync" (`every`), every BatchNormalization, a plain one too, so a model
written elsewhere (keras.applications) synchronizes without being rebuilt or cloned.
For those the layer's `_moments` (BatchNormalization's one call of `moments`) asks for
synchronized moments while the tower is built; the layer's own setting is left as it
was. A masked batch norm (`mask=`) computes its moments by hand, and keeps its tower's.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence

import tensorflow as tf

from towers import batch_stats
from towers.batch_stats import TowerSums

_BACKEND = "keras.src.backend.tensorflow.nn"
_LAYER = "keras.src.layers.normalization.batch_normalization"


@contextlib.contextmanager
def synchronized_moments(batch_sum: TowerSums | None, every: bool = False) -> Iterator[None]:
    """Inside, Keras' synchronized moments sum over the towers with `batch_sum`, and with
    `every` every BatchNormalization asks for them; None, or Keras not imported (only a
    model that imported it makes Keras layers): no change."""
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
        with _every_layer_synchronized() if every else contextlib.nullcontext():
            yield
    finally:
        backend._compute_moments_sync = before


@contextlib.contextmanager
def _every_layer_synchronized() -> Iterator[None]:
    """Every BatchNormalization's moments synchronized while inside."""
    layer = getattr(sys.modules.get(_LAYER), "BatchNormalization", None)
    if layer is None or not hasattr(layer, "_moments"):
        yield
        return
    own = layer._moments

    def moments(self, inputs: tf.Tensor, mask: tf.Tensor | None) -> tuple:
        setting = self.synchronized
        object.__setattr__(self, "synchronized", True)  # not tracked as a layer's state
        try:
            return own(self, inputs, mask)
        finally:
            object.__setattr__(self, "synchronized", setting)

    layer._moments = moments
    try:
        yield
    finally:
        layer._moments = own


def _positive(axes: Sequence[int], rank: int) -> set[int]:
    return {a % rank for a in axes}
