"""Random draws of each example its own, keyed by the example's position in the data.

A training example has a position (its place in the data's epochs laid end to end),
and whatever is random about it (its dropout masks, its crop) is drawn from (seed,
position) alone: the same whichever tower, micro-batch, worker or rank holds it, and
on every resume. TensorFlow's stateless ops take one seed per call, so per-example
seeds would cost a call per example (``tf.vectorized_map`` runs them as a loop: about
45 us an example here). Philox is a counter-based generator instead: one
``StatelessRandomUniformV2`` call gives 4 float32 values per counter step, so example
p's ``width`` values are taken at counter p * ceil(width / 4): a tower draws the
consecutive rows of its own examples in one call, and those rows equal the same rows
of a draw for the whole batch (``tests/towers/test_tower_randomness.py`` checks this).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

PHILOX = 1  # tf.random.Algorithm.PHILOX: the counter layout relied on above
_PER_COUNTER = 4  # float32 values one Philox counter step gives


def example_uniform(positions: tf.Tensor, width: int, seed: tf.Tensor) -> tf.Tensor:
    """Uniform float32 in [0, 1), [n, width]: row i drawn from (seed, positions[i]) alone.

    positions: int64 [n], increasing (a batch's examples, as the input gives them);
    their span is drawn in one call and the rows of the positions gathered from it, so
    gaps cost their rows. seed: int64 [2].
    """
    lanes = -(-width // _PER_COUNTER) * _PER_COUNTER
    positions = tf.cast(positions, tf.int64)
    first = positions[0]
    span = positions[-1] - first + 1
    key, counter = tf.raw_ops.StatelessRandomGetKeyCounter(seed=tf.cast(seed, tf.int64))
    start = tf.bitcast(first * (lanes // _PER_COUNTER), tf.uint64)
    counter = tf.stack([start, counter[1]])
    draws = tf.raw_ops.StatelessRandomUniformV2(
        shape=tf.stack([span, lanes]), key=key, counter=counter, alg=PHILOX,
        dtype=tf.float32)
    return tf.gather(draws, positions - first)[:, :width]


def example_seed(seed: int | tf.Tensor, salt: int) -> tf.Tensor:
    """int64 [2]: the seed of one kind of draw (a layer's dropout, a crop) of ``seed``."""
    return tf.stack([tf.cast(seed, tf.int64), tf.constant(salt, tf.int64)])


class ExampleDraws:
    """A tower's random draws, each of its examples its own (example_uniform): each call
    a new kind of draw (the next layer's dropout), numbered in the order the model makes
    them, which is the same in every tower and every build of it.

    positions: int64 [n], the tower's examples' positions. seed: the draws' seed.
    """

    def __init__(self, positions: tf.Tensor, seed: int):
        self.positions = positions
        self.seed = seed
        self._calls = 0

    def uniform(self, shape: tf.TensorShape | tuple[int, ...]) -> tf.Tensor:
        """Uniform float32 in [0, 1), [n, *shape]: each example's own draws."""
        shape = tuple(tf.TensorShape(shape).as_list())
        if None in shape:
            raise ValueError(f"an example's draws need a static shape, got {shape}")
        self._calls += 1
        width = max(1, int(np.prod(shape, dtype=np.int64)))
        draws = example_uniform(self.positions, width, example_seed(self.seed, self._calls))
        return tf.reshape(draws, (-1, *shape))
