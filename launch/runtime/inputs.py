"""A process's input: batches of its data source as the tensors a graph is built on.

Training batches start where the data stands (launch.data.position): the pipeline's
first position and its number of batches are fed when its iterator starts, which the
session's start does (launch.runtime.data_state), once the checkpoint has said where.
"""

from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf

from launch import data
from launch.data.position import BatchPart
from launch.data.skips import INPUT_OP_NAME
from launch.data.sources.base import NO_END
from launch.runtime.plan import Plan

V1 = tf.compat.v1


@dataclass(frozen=True)
class TrainingInput:
    """This process's training batches as tensors, and how to start them.

    features [b, ...], labels [b, ...], positions int64 [b]: one batch, its examples'
    positions. part: this process's part of every global batch. num_examples: N, the
    positions an epoch holds. identity: what makes the data the same data (files and
    sizes). start, batches: the placeholders initializer is fed with.
    """

    features: tf.Tensor
    labels: tf.Tensor
    positions: tf.Tensor
    part: BatchPart
    num_examples: int
    identity: str
    start: tf.Tensor
    batches: tf.Tensor
    initializer: tf.Operation

    def begin(self, session, start: int, batches: int | None = None) -> None:
        """Start the batches at global batch position ``start``: ``batches`` of them
        (None: no end)."""
        session.run(self.initializer, {self.start: start,
                                       self.batches: NO_END if batches is None else batches})


def training_input(plan: Plan, global_batch: int,
                   skipped: data.SkippedRecords | None = None) -> TrainingInput:
    """This process's part of every global batch of ``global_batch`` examples, built on
    the plan's host; skipped: where records skipped under data.on_bad_record: skip are
    counted."""
    source, spec = plan.source, plan.model.input_spec
    part = BatchPart.of(global_batch, *plan.share)
    with tf.device(plan.host):
        # Unfed (a scaffold's local initialiser, a benchmark): from position 0, no end.
        start = V1.placeholder_with_default(tf.constant(0, tf.int64), [], name="data_start")
        batches = V1.placeholder_with_default(tf.constant(NO_END, tf.int64), [],
                                              name="data_batches")
        dataset = source.training_dataset(spec, part, start, batches, skipped)
        iterator = V1.data.make_initializable_iterator(dataset)
        features, labels, positions = iterator.get_next(name=INPUT_OP_NAME)
    for tensor, shape in zip((features, labels, positions), dataset.element_spec,
                             strict=True):
        tensor.set_shape(shape.shape)
    return TrainingInput(features, labels, positions, part, source.examples(spec),
                         source.identity(spec), start, batches, iterator.initializer)


def input_tensors(plan: Plan, batch_size: int,
                  skipped: data.SkippedRecords | None = None) -> tuple[tf.Tensor, tf.Tensor]:
    """features [B, ...] and labels [B, ...] of one evaluation batch, produced on the
    plan's host: the evaluation data once through, its last batch holding what is left.

    skipped: where to count records skipped under ``data.on_bad_record: skip``.
    """
    with tf.device(plan.host):
        dataset = plan.source.eval_dataset(plan.model.input_spec, batch_size, skipped)
        return data.input_tensors(dataset)
