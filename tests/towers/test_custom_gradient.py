"""towers.custom_gradient: tf.custom_gradient's gradients in graph mode, and its graph freed."""

import gc
import weakref

import numpy as np
import pytest
import tensorflow as tf

import towers
from models import layers
from models.base import classifier_outputs


@towers.custom_gradient
def doubled_with_gradient_three(x):
    """2x forward; 3 dy backward, so a gradient that is not the op's own shows."""
    return 2.0 * x, lambda dy: 3.0 * dy


@towers.custom_gradient
def sum_and_difference(x, y):
    """(x + y, x - y); gradients 10 and 100 per output, only x's (y gets None)."""

    def grad(d_sum, d_difference):
        return 10.0 * d_sum + 100.0 * d_difference, None

    return (x + y, x - y), grad


def _gradients(loss, xs):
    with tf.compat.v1.Session() as session:
        return session.run(tf.compat.v1.gradients(loss, xs))


def test_the_given_gradient_replaces_the_ops_own(graph):
    x = tf.constant([1.0, 2.0])
    y = doubled_with_gradient_three(x)
    (dx,) = _gradients(tf.reduce_sum(y * [1.0, 5.0]), [x])
    np.testing.assert_allclose(dx, [3.0, 15.0])


def test_several_outputs_an_unused_one_and_an_input_without_gradient(graph):
    x, y = tf.constant(1.0), tf.constant(2.0)
    total, difference = sum_and_difference(x, y)
    assert tf.compat.v1.Session().run([total, difference]) == [3.0, -1.0]
    dx, dy = tf.compat.v1.gradients(7.0 * difference, [x, y])
    assert dy is None
    assert tf.compat.v1.Session().run(dx) == 700.0
    (dx,) = _gradients(total, [x])
    assert dx == 10.0


def test_a_tape_in_a_function_takes_the_given_gradient():
    @tf.function
    def gradient(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = doubled_with_gradient_three(x)
        return tape.gradient(y, x)

    with tf.Graph().as_default():
        dx = gradient(tf.constant(1.0))
        assert tf.compat.v1.Session().run(dx) == 3.0


def test_inside_a_loop_body_the_given_gradient_is_taken(graph):
    x = tf.constant(1.0)
    _, y = tf.while_loop(lambda i, v: i < 2, lambda i, v: (i + 1, doubled_with_gradient_three(v)),
                         [0, x])
    assert tf.compat.v1.Session().run(y) == 4.0
    (dx,) = _gradients(y, [x])
    assert dx == 9.0


def test_a_graph_imported_from_its_graph_def_says_where_the_gradient_went(graph):
    doubled_with_gradient_three(tf.constant(1.0, name="x"))
    with tf.Graph().as_default():
        tf.graph_util.import_graph_def(graph.as_graph_def(), name="")
        y = tf.compat.v1.get_default_graph().get_tensor_by_name("IdentityN:0")
        x = tf.compat.v1.get_default_graph().get_tensor_by_name("x:0")
        with pytest.raises(LookupError, match="kept with the graph that built it"):
            tf.compat.v1.gradients(y, x)


def _batch_norm_classifier(features, labels, ctx):
    """A batch norm (its moments synchronized under batch_norm="sync") and a logit."""
    normalized = layers.batch_norm(features, ctx.is_training, across=ctx.batch_sum)
    return classifier_outputs(layers.dense(normalized, 2, scope="logits"), labels)


def _sync_batch_norm_step() -> weakref.ref:
    """A weak reference to a graph holding a step on two towers with synchronized batch
    norm (custom gradients for its moments and its normalization), gradients taken."""
    graph = tf.Graph()
    with graph.as_default():
        towers.build_train_op(
            _batch_norm_classifier, tf.zeros([4, 3]), tf.zeros([4], tf.int32),
            tf.compat.v1.train.GradientDescentOptimizer(0.1), ["/cpu:0", "/cpu:1"],
            batch_norm="sync")
    return weakref.ref(graph)


def test_a_graph_with_custom_gradients_is_freed_with_them():
    step = _sync_batch_norm_step()
    gc.collect()
    assert step() is None
