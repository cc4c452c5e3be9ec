"""Each tower draws its own random numbers (dropout masks), and a fixed seed draws them
again: N towers apply independent noise, as one device on the whole batch does."""

import random

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import cpu_session_config
from helpers.tower_training import cpus

import towers
from models import layers


def builtin_dropout(features):
    return layers.dropout(features, 0.5, is_training=True)


def keras_dropout(features):
    return keras.layers.Dropout(0.5)(features, training=True)


def masks(dropout, seed=0):
    """The dropout masks of 2 towers of 4 examples each, one per tower, [4, 64] each."""
    keras.utils.clear_session()
    captured = []

    def model_fn(features, labels, ctx):
        w = tf.compat.v1.get_variable("w", [64])
        dropped = dropout(features)
        captured.append(tf.not_equal(dropped, 0.0))
        return tf.reduce_mean(dropped * w)

    python_random = random.getstate()  # other tests keep theirs
    random.seed(seed)  # Keras draws its generators' seeds from Python's, as the launcher seeds
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(seed)
        ops = towers.build_train_op(model_fn, tf.ones([8, 64]), tf.zeros([8], tf.int32),
                                    tf.compat.v1.train.GradientDescentOptimizer(0.1), cpus(2))
        with tf.compat.v1.Session(config=cpu_session_config(2)) as sess:
            random.setstate(python_random)
            sess.run(ops.init_op)
            return sess.run(captured)


@pytest.mark.parametrize("dropout", [builtin_dropout, keras_dropout])
def test_towers_draw_different_masks_and_a_seed_draws_them_again(dropout):
    first, second = masks(dropout)
    assert 0.3 < first.mean() < 0.7 and 0.3 < second.mean() < 0.7
    assert (first != second).mean() > 0.3  # independent halves differ in about half
    again = masks(dropout)
    np.testing.assert_array_equal(np.stack(again), np.stack([first, second]))
    other_seed = masks(dropout, seed=1)
    assert (np.stack(other_seed) != np.stack([first, second])).any()
