"""Gradient accumulation: k micro-batches, one update, equal to one step on the whole batch."""

import numpy as np
import pytest
import tensorflow as tf
from conftest import cpu_session_config
from helpers.tower_training import (
    check_equivalent,
    cpus,
    image_batches,
    momentum,
    moving_mean_model,
    tiny_classifier,
)

import models
import towers

MODES = {
    "parameter_server": "parameter_server",
    "replicated": "replicated",
    # A single process's stand-in for Horovod's all-reduce (the real one: tests/launch).
    "cross_process": towers.CrossProcess(lambda values: values),
    # As a ps/worker job's worker: summed on its own device, then sent to the variables.
    "aggregated_elsewhere": towers.ParameterServer("/cpu:3", aggregation_device="/cpu:2"),
}


# Every mode on the MLP; the conv layers once, in the mode with the most to go wrong
# (per-tower copies and an all-reduce).
@pytest.mark.parametrize("model_name, mode", [*[("mlp", mode) for mode in MODES],
                                              ("convnet", "replicated")])
def test_accumulating_micro_batches_equals_one_step_on_the_whole_batch(model_name, mode):
    check_equivalent(model_name, 2, batch_size=12, mode=MODES[mode], accumulate_steps=3)


def test_uneven_micro_batches_are_weighted_by_their_examples():
    # 11 examples: micro-batches of 4, 4 and 3, each split over 2 towers (2+2, 2+2, 2+1).
    # The weights are the step's, whatever the mode.
    check_equivalent("mlp", 2, batch_size=11, mode="replicated", accumulate_steps=3)


def accumulating_graph(accumulate_steps, num_towers=2, model_fn=tiny_classifier, **kwargs):
    x = tf.compat.v1.placeholder(tf.float32, [12, 4])
    y = tf.compat.v1.placeholder(tf.int32, [12])
    ops = towers.build_train_op(model_fn, x, y, momentum(), cpus(num_towers),
                                accumulate_steps=accumulate_steps, **kwargs)
    xb, yb = image_batches(models.InputSpec((4,), tf.float32, (), tf.int32, 3), 12, 1)[0]
    return ops, {x: xb, y: yb}


def test_one_session_run_is_one_update(graph):
    ops, feed = accumulating_graph(4, num_towers=1)
    with tf.compat.v1.Session(config=cpu_session_config(1)) as sess:
        sess.run(ops.init_op)
        for _ in range(3):
            sess.run(ops.train_op, feed)
        assert sess.run(ops.global_step) == 3


def ancestors(op: tf.Operation) -> set[str]:
    seen, todo = set(), [op]
    while todo:
        current = todo.pop()
        for parent in [t.op for t in current.inputs] + list(current.control_inputs):
            if parent.name not in seen:
                seen.add(parent.name)
                todo.append(parent)
    return seen


def test_each_micro_batch_waits_for_the_previous_ones_gradients(graph):
    accumulating_graph(3)
    for m, tower in [(1, 0), (1, 1), (2, 0), (2, 1)]:
        scope = f"micro_batch_{m}/tower_{tower}/"
        previous = f"micro_batch_{m - 1}/tower_{tower}/" if m > 1 else f"tower_{tower}/"
        forward = [op for op in graph.get_operations()
                   if op.name.startswith(scope) and "/gradients/" not in op.name
                   and "/accumulate/" not in op.name and "/send/" not in op.name]
        assert len(forward) > 5
        for op in forward:
            assert any(a.startswith(previous + "gradients/") for a in ancestors(op)), op.name
        # ... and only on this tower's, so towers do not wait for each other.
        other = f"tower_{1 - tower}/gradients/"
        assert not any(other in a for op in forward for a in ancestors(op))


def test_batch_norm_statistics_come_from_the_first_micro_batch(graph):
    # One tower, two micro-batches: ones, then fives. The moving mean is the first's.
    x = np.concatenate([np.ones((4, 4)), 5 * np.ones((4, 4))]).astype(np.float32)
    ops = towers.build_train_op(moving_mean_model, tf.constant(x), tf.zeros([8], tf.int32),
                                momentum(), cpus(1), accumulate_steps=2)
    (moving,) = [v for v in tf.compat.v1.global_variables() if "moving_mean" in v.op.name]
    with tf.compat.v1.Session(config=cpu_session_config(1)) as sess:
        sess.run(ops.init_op)
        sess.run(ops.train_op)
        np.testing.assert_array_equal(sess.run(moving), np.ones(4))


def test_variables_are_made_once(graph):
    accumulating_graph(3, variable_update="replicated")
    names = sorted(v.op.name for v in tf.compat.v1.global_variables())
    assert names == ["b", "b/Momentum", "global_step", "w", "w/Momentum"]
    assert len(tf.compat.v1.get_collection(towers.REPLICA_COPIES)) == 4


@pytest.mark.parametrize("steps, message", [
    (7, "a global batch of 12 examples cannot give each of 2 towers at least one example of "
        "each of 7 micro-batches; it needs at least 14"),
    (0, "accumulate_steps must be a positive integer"),
])
def test_bad_accumulation_is_a_clear_error(graph, steps, message):
    with pytest.raises(ValueError, match=message):
        accumulating_graph(steps)


def test_a_batch_size_known_only_when_running_accumulates_the_same(graph):
    """Micro-batches of a placeholder batch are cut in the graph, as towers' shards are."""
    (xb, yb), = image_batches(models.InputSpec((4,), tf.float32, (), tf.int32, 3), 11, 1)

    def one_step(shape):
        with tf.Graph().as_default():
            tf.compat.v1.set_random_seed(0)
            x = tf.compat.v1.placeholder(tf.float32, [shape, 4])
            y = tf.compat.v1.placeholder(tf.int32, [shape])
            ops = towers.build_train_op(tiny_classifier, x, y, momentum(), cpus(2),
                                        accumulate_steps=3)
            with tf.compat.v1.Session(config=cpu_session_config(2)) as sess:
                sess.run(ops.init_op)
                sess.run(ops.train_op, {x: xb, y: yb})
                return sess.run(tf.compat.v1.trainable_variables())

    for static, dynamic in zip(one_step(11), one_step(None), strict=True):
        np.testing.assert_allclose(dynamic, static, atol=1e-6)
