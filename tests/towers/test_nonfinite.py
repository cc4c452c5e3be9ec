"""Non-finite steps are caught before the update: raise or skip."""

import numpy as np
import pytest
import tensorflow as tf
from conftest import cpu_session_config
from helpers.tower_training import cpus, momentum, moving_mean_model

import towers


def run_poisoned_step(mode, nonfinite, optimizer=momentum):
    """One finite step, then one whose batch holds a NaN; the state before and after it."""
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(0)
        x = tf.compat.v1.placeholder(tf.float32, [8, 4])
        y = tf.compat.v1.constant(np.zeros(8, np.int32))
        ops = towers.build_train_op(moving_mean_model, x, y, optimizer(), cpus(2),
                                    variable_update=mode, nonfinite=nonfinite)
        variables = tf.compat.v1.global_variables() + list(
            tf.compat.v1.get_collection(towers.REPLICA_COPIES))
        good = np.ones((8, 4), np.float32)
        bad = good.copy()
        bad[5, 2] = np.nan
        with tf.compat.v1.Session(config=cpu_session_config(2)) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(ops.sync_op)
            assert sess.run(ops.all_finite, {x: good}) and sess.run(ops.train_op, {x: good}) is None
            before = sess.run({v.op.name: v for v in variables})
            try:
                _, finite = sess.run([ops.train_op, ops.all_finite], {x: bad})
                error = None
            except tf.errors.InvalidArgumentError as err:
                finite, error = None, err.message
            after = sess.run({v.op.name: v for v in variables})
    return before, after, finite, error


@pytest.mark.parametrize("mode", ["parameter_server", "replicated"])
def test_raise_policy_fails_the_step_and_updates_nothing(mode):
    before, after, _, error = run_poisoned_step(mode, "raise")
    assert error is not None and "non-finite" in error
    assert before.keys() == after.keys() and len(before) > 3
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value, err_msg=name)


@pytest.mark.parametrize("mode", ["parameter_server", "replicated"])
@pytest.mark.parametrize("optimizer", [momentum, lambda: tf.compat.v1.train.AdamOptimizer(0.1)],
                         ids=["momentum", "adam"])
def test_skip_policy_leaves_every_variable_but_the_step(mode, optimizer):
    before, after, finite, error = run_poisoned_step(mode, "skip", optimizer)
    assert error is None and not finite
    for name, value in before.items():
        if name == "global_step":
            assert after[name] == value + 1
        else:
            np.testing.assert_array_equal(after[name], value, err_msg=name)
    assert all(np.isfinite(v).all() for v in after.values())
