"""What a model function is told about the tower it is building, and what it returns."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import tensorflow as tf

from towers import batch_stats
from towers.batch_stats import TowerSums
from towers.example_random import ExampleDraws

Features = tf.Tensor | Mapping[str, tf.Tensor]


@dataclass(frozen=True)
class TowerContext:
    """The facts a model function may depend on; never the device list itself.

    index: this tower's position, 0 .. num_towers - 1.
    num_towers: how many towers share the global batch.
    device: the device this tower's compute runs on (for logging only: models
        must not place ops themselves).
    is_training: False when the graph is built for evaluation (dropout off,
        batch norm uses moving statistics).
    num_examples: scalar int32 tensor, the examples in this tower's shard.
    compute_dtype: what the tower computes in (float32, or bfloat16 / float16 in
        mixed precision); float features arrive in it, and trainable variables
        asked for without a dtype are read in it. Values a model keeps in float32
        (embedding rows looked up by integer ids) are cast to it where they enter
        the compute.
    batch_sum: with synchronized batch norm (build_train_op's batch_norm="sync"), the
        tower's handle on the statistics of every tower of the step (and every
        process): called with a float32 tensor, its sum, with its gradient;
        batch_moments uses it. None when each tower's batch statistics are its own.
        Every tower must make the same calls in the same order (towers.batch_stats).
    draws: the tower's examples' own random draws (``draws.uniform(shape)``: float32
        [num_examples, *shape]), each a function of the example's position in the data
        and the draw's number, so dropout masks are the same however the batch is
        split; None when the batch came without positions (then draw as you like).
    """

    index: int
    num_towers: int
    device: str
    is_training: bool
    num_examples: Any = None
    compute_dtype: tf.DType = tf.float32
    batch_sum: TowerSums | None = None
    draws: ExampleDraws | None = None

    def batch_moments(self, x: tf.Tensor, axes: Sequence[int]
                      ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """The float32 mean and biased variance over `axes` of x (e.g. [batch, h, w, c]
        over [0, 1, 2] gives two [c] tensors), and the element count they are over:
        of the whole global batch with synchronized batch norm, else of this shard."""
        return batch_stats.moments(x, axes, self.batch_sum)

    @property
    def is_first(self) -> bool:
        """True for tower 0, the one whose batch-norm updates and summaries count."""
        return self.index == 0


class TowerOutputs(NamedTuple):
    """What one tower returns.

    loss: scalar float tensor, the mean loss over this tower's examples.
    metrics: scalar tensors (accuracy, perplexity, ...), each a mean over this
        tower's examples; the builder averages them across towers by example count.
    predictions: optional, what serving the model returns for this tower's
        examples, [num_examples, ...] (class probabilities for a classifier);
        evaluation concatenates the towers' in batch order, and an exported model
        serves it.
    """

    loss: tf.Tensor
    metrics: Mapping[str, tf.Tensor] = {}
    predictions: tf.Tensor | None = None


ModelFn = Callable[[Features, tf.Tensor, TowerContext], TowerOutputs | tf.Tensor]


def as_tower_outputs(result: TowerOutputs | tf.Tensor) -> TowerOutputs:
    """Accept a bare loss tensor from simple model functions."""
    if isinstance(result, TowerOutputs):
        return result
    if isinstance(result, tf.Tensor):
        return TowerOutputs(loss=result, metrics={})
    raise TypeError(
        f"model_fn must return towers.TowerOutputs or a scalar loss tensor, got {type(result)!r}"
    )


@contextlib.contextmanager
def own_collection(key: str, kept_in: str | None = None) -> Iterator[None]:
    """Inside: graph collection `key` holds only what is added inside. After: all of it.

    What a model sees of a collection while its tower is built: LOSSES (so
    `tf.compat.v1.losses.get_total_loss()` is the tower's own loss), and a replicated
    tower's REGULARIZATION_LOSSES. kept_in: the graph collection that keeps a tower's
    own entries from one build of the tower to the next (a later micro-batch's):
    inside, `key` starts with them; after, it holds what it held before, and
    `kept_in` what `key` held inside."""
    collection = tf.compat.v1.get_collection_ref(key)
    before = list(collection)
    kept = tf.compat.v1.get_collection_ref(kept_in) if kept_in else []
    collection[:] = kept
    try:
        yield
    finally:
        if kept_in:
            kept[:], collection[:] = list(collection), before
        else:
            collection[:0] = before
