"""Models written with TF1 idioms or Keras 3 layers, on towers, against one device.

Keras layers make their variables with tf.Variable, not get_variable: towers
matches them across towers by creation order (towers.sharing), so a Keras model
built in every tower shares tower 0's variables (parameter_server) or gets copies
(replicated), and checkpoints name them without a tower prefix.
"""

import functools

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import cpu_session_config
from helpers.tower_training import assert_same_variables, cpus, image_batches, momentum, train

import models
import towers

v1 = tf.compat.v1
SPEC = models.InputSpec((4,), tf.float32, (), tf.int32, 3)
MODES = ["parameter_server", "replicated"]


def regularized(weights):
    return 0.05 * tf.nn.l2_loss(weights)


def tf1_regularization_loss(features, labels, ctx):
    """get_variable(regularizer=...) + get_regularization_loss(), and a step counter
    updated through UPDATE_OPS (tower 0's alone run, once per step)."""
    w = v1.get_variable("dense/w", [4, 3], regularizer=regularized)
    b = v1.get_variable("dense/b", [3], initializer=v1.zeros_initializer(),
                        regularizer=regularized)
    steps = v1.get_variable("updates_seen", [], initializer=v1.zeros_initializer(),
                            trainable=False)
    v1.add_to_collection(v1.GraphKeys.UPDATE_OPS, steps.assign_add(1.0))
    logits = tf.matmul(features, w) + b
    return (v1.losses.sparse_softmax_cross_entropy(labels, logits)
            + v1.losses.get_regularization_loss())


def tf1_total_loss(features, labels, ctx):
    """The same through get_total_loss(): the LOSSES collection plus the penalties."""
    w = v1.get_variable("dense/w", [4, 3], regularizer=regularized)
    v1.losses.sparse_softmax_cross_entropy(labels, tf.matmul(features, w))
    return v1.losses.get_total_loss()


def keras_in_model_function(features, labels, ctx):
    """A Keras model made in the model function, so in every tower."""
    net = keras.Sequential([
        keras.layers.Dense(8, activation="tanh", kernel_regularizer=keras.regularizers.L2(0.01)),
        keras.layers.Dense(3),
    ])
    logits = net(features, training=ctx.is_training)
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits, loss_collection=None)
    return towers.TowerOutputs(loss + tf.add_n(net.losses))


BATCHES = image_batches(SPEC, 12, 5)


@functools.cache
def one_device(model_fn):
    """(start, final) of model_fn trained on one device: the reference its comparisons
    share (read, never changed)."""
    keras.utils.clear_session()  # Keras names its layers afresh in each run
    return train(model_fn, ["/cpu:0"], BATCHES)


def compare(model_fn, num_towers, mode, **options):
    """options: more build_train_op arguments for the towers (accumulate_steps)."""
    start, single = one_device(model_fn)
    keras.utils.clear_session()
    _, multi = train(model_fn, cpus(num_towers), BATCHES, mode=mode, initial=start, **options)
    assert_same_variables(single, multi, atol=6e-7)
    moved = [n for n in start if n != "global_step" and not np.allclose(start[n], single[n])]
    assert moved, "the runs did not train, so agreement proves nothing"
    return single


@pytest.mark.parametrize("num_towers", [2, 3])
@pytest.mark.parametrize("mode", MODES)
def test_tf1_regularization_and_update_ops_match_one_device(mode, num_towers):
    final = compare(tf1_regularization_loss, num_towers, mode)
    assert final["updates_seen"] == 5  # once per step, from tower 0 only


@pytest.mark.parametrize("mode", MODES)
def test_get_total_loss_sums_only_the_towers_own_losses(mode):
    compare(tf1_total_loss, 3, mode)


@pytest.mark.parametrize("num_towers", [2, 3])
@pytest.mark.parametrize("mode", MODES)
def test_a_keras_model_matches_one_device_and_saves_without_tower_names(mode, num_towers):
    final = compare(keras_in_model_function, num_towers, mode)
    keras_names = [n for n in final if "dense" in n]
    assert keras_names and not any(n.startswith("tower_") for n in final)
    assert "sequential/dense/kernel" in final


def test_replicated_keras_copies_live_on_their_towers_and_are_synced(keras_graph):
    x, y = image_batches(SPEC, 8, 1)[0]
    ops = towers.build_train_op(keras_in_model_function, tf.constant(x), tf.constant(y),
                                momentum(), cpus(2), variable_update="replicated")
    copies = v1.get_collection(towers.REPLICA_COPIES)
    names = sorted(c.op.name for c in copies)
    assert "tower_1/sequential/dense/kernel" in names
    assert {c.device for c in copies} == {"/cpu:1"}
    with v1.Session(config=cpu_session_config(2)) as sess:
        sess.run(ops.init_op)
        for _ in range(2):
            sess.run(ops.train_op)
        saved = {v.op.name: v for v in v1.global_variables()}
        for copy in copies:
            source = saved[copy.op.name.split("/", 1)[1]]
            np.testing.assert_array_equal(sess.run(copy), sess.run(source))


@pytest.mark.parametrize("mode", MODES)
def test_a_keras_model_made_once_trains_shared_but_cannot_be_replicated(keras_graph, mode):
    net = keras.Sequential([keras.layers.Dense(3)])

    def shared(features, labels, ctx):  # made once, outside: every tower calls the same
        return v1.losses.sparse_softmax_cross_entropy(labels, net(features))

    def build():
        return towers.build_train_op(shared, tf.zeros([4, 4]), tf.zeros([4], tf.int32),
                                     momentum(), cpus(2), variable_update=mode)

    if mode == "parameter_server":
        build()  # every tower reads tower 0's variables, as it should
        return
    with pytest.raises(ValueError, match="tower 1 read tower 0's sequential/dense/kernel"):
        build()


def test_a_later_tower_making_other_keras_variables_is_named(keras_graph):
    def uneven(features, labels, ctx):
        layers = [keras.layers.Dense(3)] + ([keras.layers.Dense(3)] if ctx.index else [])
        return tf.reduce_mean(keras.Sequential(layers)(features))

    with pytest.raises(ValueError, match="tower 1 made variable 'kernel'.*tower 0 made only 2"):
        towers.build_train_op(uneven, tf.zeros([4, 4]), tf.zeros([4], tf.int32), momentum(),
                              cpus(2))


def plain_variables_named_alike(features, labels, ctx):
    """tf.Variable asked twice for the name 'w' (TensorFlow makes the second 'w_1')."""
    def layer(x, units):
        w = tf.Variable(tf.random.stateless_normal([x.shape[1], units], [1, units]), name="w")
        return tf.matmul(x, w)

    logits = layer(tf.tanh(layer(features, 5)), 3)
    return v1.losses.sparse_softmax_cross_entropy(labels, logits)


@pytest.mark.parametrize("mode", MODES)
def test_tf_variables_asked_for_by_one_name_match_one_device(mode):
    final = compare(plain_variables_named_alike, 2, mode)
    assert {"w", "w_1"} <= set(final)


def test_keras_micro_batches_read_the_replicas_of_the_first_and_match_one_device():
    """Each micro-batch builds the Keras model again: its creations are answered with
    the variables (and in replicated mode the copies) the first micro-batch got."""
    final = compare(keras_in_model_function, 2, "replicated", accumulate_steps=3)
    assert "sequential/dense/kernel" in final


def keras_loss_in_float32(features, labels, ctx):
    """keras_in_model_function, its loss computed in float32 as mixed precision wants."""
    net = keras.Sequential([
        keras.layers.Dense(8, activation="tanh", kernel_regularizer=keras.regularizers.L2(0.01)),
        keras.layers.Dense(3),
    ])
    logits = tf.cast(net(features, training=ctx.is_training), tf.float32)
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits, loss_collection=None)
    return towers.TowerOutputs(loss + tf.add_n([tf.cast(p, tf.float32) for p in net.losses]))


def test_keras_layers_compute_in_bfloat16_on_float32_variables(keras_graph):
    x, y = image_batches(SPEC, 8, 1)[0]
    ops = towers.build_train_op(keras_loss_in_float32, tf.constant(x), tf.constant(y),
                                momentum(), cpus(2), variable_update="replicated",
                                precision="mixed_bfloat16")
    forward = [op for op in keras_graph.get_operations()
               if op.type == "MatMul" and "gradients" not in op.name]
    assert len(forward) == 4 and {op.get_attr("T") for op in forward} == {tf.bfloat16}
    assert {v.dtype.base_dtype for v in v1.global_variables()} == {tf.float32, tf.int64}
    assert keras.config.dtype_policy().name == "float32"  # restored after the towers
    with v1.Session(config=cpu_session_config(2)) as sess:
        sess.run(ops.init_op)
        assert np.isfinite(sess.run([ops.train_op, ops.loss])[1])
