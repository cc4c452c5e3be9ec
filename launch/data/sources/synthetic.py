"""``data.source: synthetic``: one random batch, generated once in the graph and repeated,
so input costs nothing (benchmarks)."""

from __future__ import annotations

import tensorflow as tf

from launch.data.position import BatchPart
from launch.data.sources.base import Source, generated_batches
from launch.data.stream import Pipeline, finish_batch
from models import InputSpec


class Synthetic(Source):
    """Uniform floats in [0, 1) (ints in [0, num_classes)) and labels in [0, num_classes),
    made to the model's spec by stateless random ops from data.seed."""

    name = "synthetic"
    generated = True

    def batch(self, spec: InputSpec, batch_size: int, training: bool) -> tf.Tensor:
        """The one random batch: features [B, *feature_shape], labels [B, *label_shape]."""
        seed = self.cfg.seed * 2 + (0 if training else 1)

        def uniform(shape: tuple[int, ...], dtype: tf.DType, salt: int) -> tf.Tensor:
            seeds = tf.constant([seed, salt], tf.int64)
            if dtype.is_integer:
                return tf.random.stateless_uniform(
                    shape, seeds, minval=0, maxval=spec.num_classes,
                    dtype=tf.int32 if dtype == tf.int32 else tf.int64)
            return tf.random.stateless_uniform(shape, seeds, dtype=tf.float32)

        x = uniform((batch_size, *spec.feature_shape), spec.feature_dtype, 1)
        y = uniform((batch_size, *spec.label_shape), spec.label_dtype, 2)
        return finish_batch(x, y, spec, batch_size)

    def examples(self, spec: InputSpec) -> int:
        """data.num_examples: what an epoch of the one repeated batch counts."""
        return self.cfg.num_examples

    def batches(self, spec: InputSpec, p: Pipeline) -> tf.data.Dataset:
        """The evaluation batch, made once, cached and repeated; a stream that does not
        repeat ends after data.num_examples examples' worth of it."""
        keys = tf.range(p.batch_size, dtype=tf.int64)
        dataset = tf.data.Dataset.range(1).map(
            lambda _: (*self.batch(spec, p.batch_size, p.training), keys)).cache().repeat()
        if not p.repeat:
            dataset = dataset.take(max(1, self.cfg.num_examples // p.batch_size))
        return dataset.prefetch(p.prefetch)

    def positioned(self, spec: InputSpec, p: Pipeline, part: BatchPart, start: tf.Tensor,
                   batches: tf.Tensor) -> tf.data.Dataset:
        """The training batch, made once, with the positions of each step's examples."""
        made = tf.data.Dataset.range(1).map(lambda _: self.batch(spec, part.size, True)).cache()

        def positioned(k: tf.Tensor, batch: tuple) -> tuple[tf.Tensor, ...]:
            first = start + k * part.global_batch + part.offset
            return (*batch, first + tf.range(part.size, dtype=tf.int64))

        steps = tf.data.Dataset.range(batches)
        return tf.data.Dataset.zip((steps, made.repeat())).map(positioned).prefetch(p.prefetch)

    def eval_dataset(self, spec, batch_size, skipped=None) -> tf.data.Dataset:
        """Its one batch without end: an evaluation takes eval_batches of them."""
        return self.dataset(spec, batch_size, training=False, repeat=True, skipped=skipped)

    def eval_batches(self, steps: int | None, batch_size: int) -> tuple[int, str]:
        batches, why = generated_batches(steps)
        return batches, (f"data.source synthetic repeats one generated batch, with no end: an "
                         f"evaluation scores {batches} batches of {batch_size} ({why})")
