"""The model's own float32 casts, kept float64 while `towers verify` builds it.

In float64 (towers.FLOAT64) the towers give a model float64 features and variables,
but a model written for mixed precision casts its logits to float32 itself, as the
docs advise (`tf.cast(logits, tf.float32)` before the softmax and loss), and then adds
float64 regularization penalties to a float32 loss: a type error, and float32 rounding
in the middle of a float64 check. So while verify builds the model, `tf.cast` of a
float64 value to float32 leaves it float64.

A few ops have no float64 kernel: local response normalization (tf.nn.lrn, in
TensorFlow's CIFAR-10 tutorial model) runs in float32 on a float64 value, cast there
and back. It normalizes each example on its own, so one device and the towers round
each example's values alike: the comparison is unchanged. Nothing else about the
model changes.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator

import tensorflow as tf

# The modules a model reaches tf.cast, and tf.nn.lrn, through.
_CASTS = (tf, tf.dtypes, tf.compat.v1, tf.compat.v1.dtypes)
_NN = (tf.nn, tf.compat.v1.nn)
_LRN = ("lrn", "local_response_normalization")
_cast = tf.cast  # TensorFlow's own, whatever is patched


def in_float64(model_fn: Callable) -> Callable:
    """model_fn, building with its float64-to-float32 casts left float64."""

    @functools.wraps(model_fn)
    def built(features, labels, ctx):
        with float32_casts_kept(), lrn_in_float32():
            return model_fn(features, labels, ctx)

    return built


@contextlib.contextmanager
def float32_casts_kept() -> Iterator[None]:
    """Inside, tf.cast(x, tf.float32) of a float64 x returns x."""
    def cast(x, dtype, name=None):
        if tf.as_dtype(dtype) == tf.float32 and getattr(x, "dtype", None) == tf.float64:
            return x
        return _cast(x, dtype, name=name)

    before = [(module, module.cast) for module in _CASTS]
    for module, _ in before:
        module.cast = cast
    try:
        yield
    finally:
        for module, value in before:
            module.cast = value


@contextlib.contextmanager
def lrn_in_float32() -> Iterator[None]:
    """Inside, tf.nn.lrn of a float64 value computes in float32 (the op has no float64)."""
    original = tf.nn.local_response_normalization

    def lrn(x, *args, **kwargs):
        if getattr(x, "dtype", None) != tf.float64:
            return original(x, *args, **kwargs)
        return _cast(original(_cast(x, tf.float32), *args, **kwargs), tf.float64)

    before = [(module, name, getattr(module, name)) for module in _NN for name in _LRN]
    for module, name, _ in before:
        setattr(module, name, lrn)
    try:
        yield
    finally:
        for module, name, value in before:
            setattr(module, name, value)
