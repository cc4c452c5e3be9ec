"""A process's input: batches of its data source as the tensors a graph is built on."""

from __future__ import annotations

import tensorflow as tf

from launch import data
from launch.runtime.plan import Plan


def input_tensors(plan: Plan, training: bool, batch_size: int,
                  skipped: data.SkippedRecords | None = None) -> tuple[tf.Tensor, tf.Tensor]:
    """features [B, ...] and labels [B, ...] of one batch, produced on the plan's host: for
    training this process's share of the data, B = batch_size; for evaluation the
    evaluation data once through, its last batch holding what is left.

    skipped: where to count records skipped under ``data.on_bad_record: skip``.
    """
    source, spec = plan.source, plan.model.input_spec
    with tf.device(plan.host):
        if training:
            dataset = source.training_dataset(spec, batch_size, plan.share, skipped)
        else:
            dataset = source.eval_dataset(spec, batch_size, skipped)
        return data.input_tensors(dataset)
