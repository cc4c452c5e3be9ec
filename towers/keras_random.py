"""A random stream of its own for each tower's Keras layers (dropout, noise).

A Keras layer draws its randomness from a SeedGenerator whose state is a variable;
tower 0 makes it and later towers are handed the same one (towers.sharing), so
without this every tower would draw the same dropout mask: correlated noise that
one device on the whole batch never applies. Keras offers no public hook: the one
replaced is `keras.src.backend.tensorflow.random.draw_seed`, through which every
random op of that backend gets its seed.

When the batch comes with its examples' positions (build_train_op's ``positions``),
a tower's draws are seeded by (the generator's seed, the position of the tower's
first example): a function of where the data stands, not of how often the session
ran, so a resumed run draws what the uninterrupted one drew at the same step with
the same towers. Keras draws a shard's mask in one call, so another number of
towers draws other masks (the built-in layers draw per example:
towers.example_random). Without positions the seeds of tower i > 0 are the
generator's (its seed and step) offset by i: each tower its own stream, tower 0's a
single device's.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import tensorflow as tf

_BACKEND = "keras.src.backend.tensorflow.random"
# Tower i's seeds are the generator's plus i times this (odd, about 2^31 times the
# golden ratio), so the towers' streams land far apart in the seed space.
_TOWER_STRIDE = 0x9E3779B1
# Keras may hold its seeds in int32: positions are folded into that range.
_POSITION_RANGE = 2**31


@contextlib.contextmanager
def tower_seeds(index: int, positions: tf.Tensor | None = None) -> Iterator[None]:
    """Inside, Keras' random ops draw tower `index`'s own seeds (positions: int64 [n],
    its examples' positions); Keras not imported (only a model that imported it makes
    Keras layers), or tower 0 without positions: no change."""
    backend = sys.modules.get(_BACKEND)
    unchanged = index == 0 and positions is None
    if unchanged or backend is None or not hasattr(backend, "draw_seed"):
        yield
        return
    before = backend.draw_seed

    def draw_seed(seed):
        drawn = before(seed)  # [2] int32 or int64: the generator's seed and step
        if positions is not None and isinstance(seed, int):
            return drawn  # an initializer's fixed seed: weights do not depend on the data
        if positions is not None:
            first = tf.cast(positions[0] % _POSITION_RANGE, tf.int64)
            return tf.cast(tf.stack([tf.cast(drawn[0], tf.int64), first]), drawn.dtype)
        offset = tf.constant([index * _TOWER_STRIDE, 0], tf.int64)
        return tf.cast(tf.cast(drawn, tf.int64) + offset, drawn.dtype)

    backend.draw_seed = draw_seed
    try:
        yield
    finally:
        backend.draw_seed = before
