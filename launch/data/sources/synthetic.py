"""``data.source: synthetic``: one random batch, generated once in the graph and repeated,
so input costs nothing (benchmarks)."""

from __future__ import annotations

import tensorflow as tf

from launch.data.sources.base import Source, generated_batches
from launch.data.stream import Pipeline, finish_batch
from models import InputSpec


class Synthetic(Source):
    """Uniform floats in [0, 1) (ints in [0, num_classes)) and labels in [0, num_classes),
    made to the model's spec by stateless random ops from data.seed."""

    name = "synthetic"
    generated = True

    def batches(self, spec: InputSpec, p: Pipeline) -> tf.data.Dataset:
        """One random batch, made once, cached and repeated; a stream that does not
        repeat ends after data.num_examples examples' worth of it.

        Yields features [B, *feature_shape] and labels [B, *label_shape].
        """
        seed = p.seed * 2 + (0 if p.training else 1)

        def uniform(shape: tuple[int, ...], dtype: tf.DType, salt: int) -> tf.Tensor:
            seeds = tf.constant([seed, salt], tf.int64)
            if dtype.is_integer:
                return tf.random.stateless_uniform(
                    shape, seeds, minval=0, maxval=spec.num_classes,
                    dtype=tf.int32 if dtype == tf.int32 else tf.int64)
            return tf.random.stateless_uniform(shape, seeds, dtype=tf.float32)

        def make(_: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            x = uniform((p.batch_size, *spec.feature_shape), spec.feature_dtype, 1)
            y = uniform((p.batch_size, *spec.label_shape), spec.label_dtype, 2)
            return finish_batch(x, y, spec, p.batch_size)

        dataset = tf.data.Dataset.range(1).map(make).cache().repeat()
        if not p.repeat:
            dataset = dataset.take(max(1, self.cfg.num_examples // p.batch_size))
        return dataset.prefetch(p.prefetch)

    def eval_dataset(self, spec, batch_size, skipped=None) -> tf.data.Dataset:
        """Its one batch without end: an evaluation takes eval_batches of them."""
        return self.dataset(spec, batch_size, training=False, repeat=True, skipped=skipped)

    def eval_batches(self, steps: int | None, batch_size: int) -> tuple[int, str]:
        batches, why = generated_batches(steps)
        return batches, (f"data.source synthetic repeats one generated batch, with no end: an "
                         f"evaluation scores {batches} batches of {batch_size} ({why})")
