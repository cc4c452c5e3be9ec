"""What a process checks before it writes anything: its data against the model, the
checkpoint paths it writes; and everything `towers train` checks before its first step,
for `towers validate`."""

from __future__ import annotations

import dataclasses

import tensorflow as tf

import models
from launch import data
from launch.config import JobConfig
from launch.runtime import checkpoints
from launch.runtime.plan import Plan, make_plan
from launch.runtime.training_graph import build_training_graph


def preflight(job: JobConfig, plan: Plan, is_chief: bool = True) -> None:
    """Check what can be checked before anything is written: the data, and for the
    chief (the only process that writes them) the checkpoint paths."""
    check_data(plan)
    if not is_chief:
        return
    checkpoints.check_writable_dir(job.train.checkpoint_dir, "train.checkpoint_dir")
    if job.train.warm_start is not None:
        checkpoints.resolve(job.train.warm_start.path, "train.warm_start.path")


def check_data(plan: Plan, training: bool = True) -> None:
    """The training data or the evaluation data against the
    model's input spec; a user's model that disagrees with it is named beside it."""
    try:
        plan.source.check(plan.model.input_spec, training=training)
    except data.DataError as err:
        if plan.model.source == "built-in":
            raise
        # The user's model and the data disagree: name both sides.
        raise data.DataError(
            f"{err} (model {plan.model.name} takes "
            f"{models.describe_spec(plan.model.input_spec)})"
        ) from None


def check_startup(job: JobConfig) -> Plan:
    """Every check `towers train` makes before its first step, made without training or
    writing anything (`towers validate`): the plan (model, devices, batch), the data and
    the evaluation data, the checkpoint paths, the whole graph built aside (the model
    against the data's shapes and classes), and the checkpoint found against the model."""
    plan = make_plan(job)
    preflight(job, plan)
    if job.data.eval_path:
        check_data(plan, training=False)
    with tf.Graph().as_default():
        build_training_graph(job, _shapes_only(job, plan))
        checkpoints.check_compatible(job.train.checkpoint_dir)
    return plan


def _shapes_only(job: JobConfig, plan: Plan) -> Plan:
    """The plan the graph is checked with: a generated source (builtin) makes its data
    to the model's spec, so the graph is built on synthetic batches of that spec instead
    of generating the whole data set (seconds, minutes for a large one) to build it."""
    if not plan.source.generated:
        return plan
    synthetic = data.source_of(dataclasses.replace(job.data, source="synthetic"))
    return dataclasses.replace(plan, source=synthetic)
