"""Small models for the tests of `towers verify`: one that trains on towers as on one
device, and ways to get it wrong or make it noisy."""

import keras
import tensorflow as tf

v1 = tf.compat.v1

INPUT = {"feature_shape": (6,), "num_classes": 3}
DECAY = 0.05


def _dense(x, units, name):
    w = v1.get_variable(f"{name}/kernel", [x.shape[-1], units],
                        regularizer=lambda k: DECAY * tf.nn.l2_loss(k))
    return tf.matmul(x, w)


def _batch_norm(x, ctx):
    """Normalized by ctx.batch_moments (the global batch's under sync), with a moving
    mean in UPDATE_OPS."""
    gamma = v1.get_variable("bn/gamma", [x.shape[-1]], initializer=v1.ones_initializer())
    beta = v1.get_variable("bn/beta", [x.shape[-1]], initializer=v1.zeros_initializer())
    moving = v1.get_variable("bn/moving_mean", [x.shape[-1]], trainable=False,
                             initializer=v1.zeros_initializer())
    mean, variance, _ = ctx.batch_moments(x, [0])
    mean, variance = tf.cast(mean, x.dtype), tf.cast(variance, x.dtype)
    v1.add_to_collection(v1.GraphKeys.UPDATE_OPS, moving.assign_sub((moving - mean) * 0.5))
    return tf.nn.batch_normalization(x, mean, variance, beta, gamma, 1e-3)


def _logits(x, ctx):
    return _dense(tf.tanh(_batch_norm(_dense(x, 5, "dense1"), ctx)), 3, "dense2")


def _loss(logits, labels):
    # As docs/library.md advises for mixed precision: the loss in float32.
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=tf.cast(logits, tf.float32)))


def model_fn(x, y, ctx):
    return _loss(_logits(x, ctx), y) + v1.losses.get_regularization_loss()


def tower_dependent(x, y, ctx):
    """Wrong on purpose: dense2's weight decay counted once per tower, which one device
    counts once."""
    logits = _logits(x, ctx)
    penalty = v1.losses.get_regularization_loss(scope="dense2")
    return _loss(logits, y) + ctx.num_towers * penalty + v1.losses.get_regularization_loss(
        scope="dense1")


def stochastic_depth(x, y, ctx):
    """A residual branch dropped at random, drawn with tf.random.uniform: noise verify
    has no rate to set to 0."""
    h = _dense(x, 6, "dense1")
    keep = tf.cast(tf.random.uniform([]) > 0.2, h.dtype)
    return _loss(_dense(x + keep * tf.tanh(h), 3, "dense2"), y)


def float32_constant(x, y, ctx):
    """A float32 value of the model's own, which float64 features meet."""
    return _loss(_dense(x * tf.constant(2.0, tf.float32), 3, "dense1"), y)


def keras_with_dropout():
    net = keras.Sequential([keras.layers.Dense(8, activation="relu"), keras.layers.Dropout(0.5),
                            keras.layers.Dense(3)])
    net.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"])
    return net


for _model in (model_fn, tower_dependent, stochastic_depth, float32_constant,
               keras_with_dropout):
    _model.input_spec = INPUT
