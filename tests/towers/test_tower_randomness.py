"""Each tower draws its own random numbers (dropout masks), and a fixed seed draws them
again: N towers apply independent noise, as one device on the whole batch does. Given
the examples' positions, the built-in dropout draws each example's own mask: N towers
draw exactly one device's masks."""

import random

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import cpu_session_config
from helpers.tower_training import cpus

import towers
from models import layers


def builtin_dropout(features, ctx):
    return layers.dropout(features, 0.5, ctx)


def keras_dropout(features, ctx):
    return keras.layers.Dropout(0.5)(features, training=True)


def masks(dropout, seed=0, first=None, devices=2):
    """The dropout masks of 8 examples on `devices` towers, one per tower, [8 / devices, 64]
    each; first: the first example's position (the others' follow), or None."""
    keras.utils.clear_session()
    captured = []

    def model_fn(features, labels, ctx):
        w = tf.compat.v1.get_variable("w", [64])
        dropped = dropout(features, ctx)
        captured.append(tf.not_equal(dropped, 0.0))
        return tf.reduce_mean(dropped * w)

    python_random = random.getstate()  # other tests keep theirs
    random.seed(seed)  # Keras draws its generators' seeds from Python's, as the launcher seeds
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(seed)
        ops = towers.build_train_op(model_fn, tf.ones([8, 64]), tf.zeros([8], tf.int32),
                                    tf.compat.v1.train.GradientDescentOptimizer(0.1),
                                    cpus(devices), seed=seed, positions=None if first is None
                                    else tf.range(first, first + 8, dtype=tf.int64))
        with tf.compat.v1.Session(config=cpu_session_config(devices)) as sess:
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


def test_with_positions_each_example_draws_its_own_mask_however_the_batch_is_split():
    one = masks(builtin_dropout, first=800, devices=1)[0]
    assert 0.3 < one.mean() < 0.7
    for devices in (2, 4):
        split = masks(builtin_dropout, first=800, devices=devices)
        np.testing.assert_array_equal(np.concatenate(split), one)
    later = masks(builtin_dropout, first=808, devices=1)[0]
    assert (later != one).mean() > 0.3  # other examples (or the next pass): other masks
    assert (masks(builtin_dropout, seed=1, first=800, devices=1)[0] != one).any()


def test_keras_layers_draw_by_position_the_same_again_and_differ_across_towers():
    first, second = masks(keras_dropout, first=800)
    assert (first != second).mean() > 0.3
    np.testing.assert_array_equal(np.stack(masks(keras_dropout, first=800)),
                                  np.stack([first, second]))
    moved = masks(keras_dropout, first=808)
    assert (np.stack(moved) != np.stack([first, second])).any()
