"""Restoring the weight averages train.moving_average_decay keeps in place of the weights:
what `towers eval --averages` and `towers export --averages` read."""

from __future__ import annotations

import tensorflow as tf

import towers
from launch.runtime.checkpoints import CheckpointError, few

V1 = tf.compat.v1


def model_saver(averages: bool) -> V1.train.Saver:
    """A saver restoring the model's variables; with `averages`, each trainable one from
    its weight average (train.moving_average_decay, towers.average_names)."""
    if not averages:
        return V1.train.Saver()
    trainable = {id(v) for v in V1.trainable_variables()}
    names = {v.op.name: v for v in V1.global_variables() if id(v) not in trainable}
    names.update(towers.average_names(V1.trainable_variables()))
    return V1.train.Saver(var_list=names)


def check_averages(path: str) -> None:
    """--averages on a checkpoint that holds none: one line saying why."""
    stored = tf.train.load_checkpoint(path).get_variable_to_shape_map()
    wanted = towers.average_names(V1.trainable_variables())
    missing = [name for name in wanted if name not in stored]
    if missing:
        raise CheckpointError(
            f"--averages: {path} holds no weight averages ({few(missing)} missing); they "
            f"are kept while train.moving_average_decay is set")
