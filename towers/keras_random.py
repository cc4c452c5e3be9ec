"""A random stream of its own for each tower's Keras layers (dropout, noise).

A Keras layer draws its randomness from a SeedGenerator whose state is a variable;
tower 0 makes it and later towers are handed the same one (towers.sharing), so
without this every tower would draw the same dropout mask: correlated noise that
one device on the whole batch never applies. While tower i > 0 is built, the seeds
Keras' TensorFlow backend draws are offset by i, so each tower has its own stream,
still a function of the generator's seed and step: a fixed seed reproduces a run,
and tower 0 draws exactly what a single device draws. Keras offers no public hook:
the one replaced is `keras.src.backend.tensorflow.random.draw_seed`, through which
every random op of that backend gets its seed.

The built-in layers need nothing: `tf.nn.dropout` takes an op seed from the graph
seed and the op's position, which differs from tower to tower.
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


@contextlib.contextmanager
def tower_seeds(index: int) -> Iterator[None]:
    """Inside, Keras' random ops draw tower `index`'s own seeds; tower 0, or Keras not
    imported (only a model that imported it makes Keras layers): no change."""
    backend = sys.modules.get(_BACKEND)
    if index == 0 or backend is None or not hasattr(backend, "draw_seed"):
        yield
        return
    before = backend.draw_seed

    def draw_seed(seed):
        drawn = before(seed)  # [2] int32 or int64: the generator's seed and step
        offset = tf.constant([index * _TOWER_STRIDE, 0], tf.int64)
        return tf.cast(tf.cast(drawn, tf.int64) + offset, drawn.dtype)

    backend.draw_seed = draw_seed
    try:
        yield
    finally:
        backend.draw_seed = before
