"""The straggler tests' model: the built-in convnet, whose every step also sleeps
``delay_secs`` (a rank made slow by this costs no CPU, so the other ranks' speed does
not depend on how a shared machine's cores are divided)."""

import time

import tensorflow as tf

import models
import towers


def build(*, delay_secs: float = 0.0, **params) -> towers.ModelFn:
    convnet = models.build("convnet", params).model_fn
    return sleeping(convnet, delay_secs) if delay_secs else convnet


def sleeping(model_fn: towers.ModelFn, delay_secs: float) -> towers.ModelFn:
    """model_fn, whose every step first sleeps `delay_secs`; the features [batch, ...]
    pass on unchanged, so the values are model_fn's own."""

    def slowed_fn(features, labels, ctx):
        def sleep(x):
            time.sleep(delay_secs)
            return x

        slowed = tf.numpy_function(sleep, [features], features.dtype, stateful=True)
        return model_fn(tf.ensure_shape(slowed, features.shape), labels, ctx)

    return slowed_fn


# The straggler job's convnet (3 channels, 2 classes: tests/helpers/stragglers.py); a
# model of one's own says what it takes, which the built-in one's name tells towers.
build.input_spec = models.build("convnet", {"channels": 3, "num_classes": 2}).input_spec
