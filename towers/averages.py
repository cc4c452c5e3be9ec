"""Weight averaging: an exponential moving average of each trainable variable.

As tf_cnn_benchmarks' `--moving_average_decay` and Keras optimizers' `use_ema` keep
them, an average beside each trainable variable, often a better model to evaluate or
serve than the last weights:

    average <- average - (1 - d) * (average - weight),  d = min(decay, (1 + t) / (10 + t))

at global step t (TensorFlow's ExponentialMovingAverage with `num_updates`, as
tf_cnn_benchmarks uses it: early averages follow the weights more closely). The
averages are state updates of the step (towers.state_updates): they run once per
step, before its update, so after step t an average has seen the weights of steps 0
to t - 1; a step the non-finite policy skips leaves them as they were. Each average is
a global variable made beside its weight (same device, or ps task), so checkpoints
keep it, a resume restores it, and `average_names` restores a model from them.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from towers import state_updates

AVERAGE_NAME = "WeightAverage"  # the averages' suffix: "dense/kernel/WeightAverage"


def check_decay(decay: float | None) -> None:
    if decay is not None and not 0.0 < decay < 1.0:
        raise ValueError(f"moving_average_decay must be between 0 and 1 (e.g. 0.999), "
                         f"got {decay}")


def averaging(decay: float, variables: Sequence[tf.Variable],
              global_step: tf.Variable) -> list[tf.Operation]:
    """Makes an average of each of `variables` (the trainable variables of the
    checkpoint's names: tower 0's) and returns the state updates that keep them
    (state_updates.work_ops)."""
    check_decay(decay)
    ema = _average(decay, global_step)
    return state_updates.work_ops(ema.apply(list(variables)))


def average_names(variables: Sequence[tf.Variable]) -> dict[str, tf.Variable]:
    """{the name of a variable's average in a checkpoint: the variable}: a
    tf.compat.v1.train.Saver(var_list=...) of this restores each variable from its
    average."""
    ema = _average(0.5)
    return {ema.average_name(v): v for v in variables}


def _average(decay: float, num_updates: tf.Variable | None = None):
    return tf.compat.v1.train.ExponentialMovingAverage(decay, num_updates=num_updates,
                                                      name=AVERAGE_NAME)
