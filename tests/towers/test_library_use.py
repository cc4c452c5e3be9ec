"""build_train_op as a library user meets it: what it runs for the model, what it tells,
what it gives back, and the one-line errors at its edges."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import cpu_session_config
from helpers.tower_training import cpus, get_variable, momentum, tiny_classifier

import towers

v1 = tf.compat.v1


def batch(size=8):
    rng = np.random.default_rng(3)
    return (rng.normal(size=(size, 4)) * 2.0 + 1.0).astype(np.float32), \
        rng.integers(0, 3, size=size).astype(np.int32)


def variable(name):
    (found,) = [v for v in v1.global_variables() if v.op.name == name]
    return found


def logits_loss(logits, labels):
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=tf.cast(logits, tf.float32)))


# --- state the model keeps ----------------------------------------------------------------

def keras_batch_norm_model(synchronized):
    def model_fn(features, labels, ctx):
        normalized = keras.layers.BatchNormalization(
            momentum=0.5, synchronized=synchronized, name="bn")(features, training=True)
        return logits_loss(tf.matmul(normalized, get_variable("w", [4, 3])), labels)

    return model_fn


@pytest.mark.parametrize("synchronized", [False, True], ids=["per_tower", "synchronized"])
@pytest.mark.parametrize("mode", ["parameter_server", "replicated"])
def test_keras_batch_norm_updates_its_moving_statistics_like_the_built_in_one(
        graph, mode, synchronized):
    # Tower 0's statistics under per-tower batch norm, the whole batch's when synchronized,
    # applied once a step (momentum 0.5 from 0: half the mean).
    x, y = batch()
    ops = towers.build_train_op(keras_batch_norm_model(synchronized), tf.constant(x),
                                tf.constant(y), momentum(), cpus(2), variable_update=mode)
    moving = variable("bn/moving_mean")
    assert moving.op.name in {u.inputs[0].op.name for u in v1.get_collection("update_ops")}
    with v1.Session(config=cpu_session_config(2)) as sess:
        sess.run(ops.init_op)
        sess.run(ops.train_op)
        got = sess.run(moving)
    seen = x if synchronized else x[:4]
    np.testing.assert_allclose(got, 0.5 * seen.mean(axis=0), rtol=1e-5)


def regularized(features, labels, ctx):
    w = get_variable("w", [4, 3], regularizer=lambda w: 0.5 * tf.nn.l2_loss(w))
    return logits_loss(tf.matmul(features, w), labels) + v1.losses.get_regularization_loss()


def test_replicated_copies_penalties_stay_with_their_towers(graph):
    # What reads the collection after the step (evaluation towers, a caller's total)
    # sees the model's penalty once, not once per copy.
    x, y = batch(6)
    ops = towers.build_train_op(regularized, tf.constant(x), tf.constant(y), momentum(),
                                cpus(3), variable_update="replicated")
    evaluation = towers.build_eval_ops(regularized, tf.constant(x), tf.constant(y), cpus(1))
    w = variable("w")
    with v1.Session(config=cpu_session_config(3)) as sess:
        sess.run(ops.init_op)
        penalty, total, train_loss, eval_loss = sess.run(
            [0.5 * tf.nn.l2_loss(w), v1.losses.get_regularization_loss(), ops.loss,
             evaluation.loss])
    assert total == pytest.approx(penalty, rel=1e-6)
    assert eval_loss == pytest.approx(train_loss, rel=1e-6)


# --- what it tells ------------------------------------------------------------------------

def moments_model(synchronized):
    def model_fn(features, labels, ctx):
        if synchronized:
            mean, variance, _ = ctx.batch_moments(features, [0])
        else:
            mean, variance = tf.nn.moments(features, [0])
        normalized = (features - mean) * tf.math.rsqrt(variance + 1e-3)
        return logits_loss(tf.matmul(normalized, get_variable("w", [4, 3])), labels)

    return model_fn


@pytest.mark.parametrize("synchronized, devices, told", [
    (False, 2, True),  # tf.nn.moments: per tower, though the caller asked for sync
    (True, 2, False),
    (False, 1, False),  # one tower: its statistics are the whole batch's
])
def test_sync_batch_norm_that_synchronizes_nothing_is_told(graph, recwarn, synchronized,
                                                             devices, told):
    x, y = batch()
    towers.build_train_op(moments_model(synchronized), tf.constant(x), tf.constant(y),
                          momentum(), cpus(devices), batch_norm="sync")
    warned = [str(w.message) for w in recwarn if "batch_norm='sync'" in str(w.message)]
    assert bool(warned) == told, warned
    if told:
        assert "ctx.batch_moments" in warned[0]


# --- what it gives back -------------------------------------------------------------------

def test_each_towers_outputs_are_returned_in_batch_order(graph):
    x, y = batch(10)
    ops = towers.build_train_op(tiny_classifier, tf.constant(x), tf.constant(y), momentum(),
                                cpus(2), accumulate_steps=2)
    # 10 examples: micro-batches of 5, each over 2 towers (3 + 2).
    assert len(ops.tower_outputs) == 4
    logits = tf.matmul(x, variable("w")) + variable("b")
    shard_losses = [logits_loss(logits[i:j], y[i:j]) for i, j in [(0, 3), (3, 5), (5, 8),
                                                                    (8, 10)]]
    with v1.Session(config=cpu_session_config(2)) as sess:
        sess.run(ops.init_op)
        got, want = sess.run([[t.loss for t in ops.tower_outputs], shard_losses])
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert set(ops.tower_outputs[0].metrics) == {"accuracy"}


# --- one-line errors at the edges ---------------------------------------------------------

def keras_optimizer():
    return keras.optimizers.SGD(0.1)


@pytest.mark.parametrize("args, message", [
    ({"devices": 2}, r"devices must be a list of device strings, one tower each; got 2: "
                     r"pass \[f'/gpu:\{i\}' for i in range\(2\)\]"),
    ({"optimizer": keras_optimizer}, "optimizer must be a tf.compat.v1.train.Optimizer, e.g. "
                                     r"tf.compat.v1.train.MomentumOptimizer\(0.1, 0.9\); got "
                                     "keras.src.optimizers.sgd.SGD"),
], ids=["devices_as_a_count", "keras_optimizer"])
def test_a_wrong_argument_is_named_in_one_line(graph, args, message):
    args = {"devices": cpus(2), "optimizer": momentum, **args}
    with pytest.raises(ValueError, match=message) as refused:
        towers.build_train_op(tiny_classifier, tf.zeros([4, 4]), tf.zeros([4], tf.int32),
                              args["optimizer"](), args["devices"])
    assert "\n" not in str(refused.value)


def test_a_second_training_step_in_one_graph_is_told_where_to_go(graph):
    build = lambda: towers.build_train_op(  # noqa: E731
        tiny_classifier, tf.zeros([4, 4]), tf.zeros([4], tf.int32), momentum(), cpus(2))
    build()
    with pytest.raises(ValueError, match="variable w already exists in this graph, made before "
                                         "build_train_op") as refused:
        build()
    assert "\n" not in str(refused.value)
    with v1.variable_scope("second"):
        build()  # under a scope of its own it is a model of its own


def test_a_batch_of_unknown_size_too_small_for_the_towers_fails_with_our_line(graph):
    x, y = v1.placeholder(tf.float32, [None, 4]), v1.placeholder(tf.int32, [None])
    ops = towers.build_train_op(tiny_classifier, x, y, momentum(), cpus(2))
    with v1.Session(config=cpu_session_config(2)) as sess:
        sess.run(ops.init_op)
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"assertion failed: \[a global batch of 1 examples cannot "
                                 r"give each of 2 towers at least one example; it needs at "
                                 r"least 2\]\n"):
            sess.run(ops.train_op, {x: np.zeros((1, 4)), y: [0]})


def test_a_session_without_the_cpu_devices_names_the_config_it_needs(graph):
    ops = towers.build_train_op(tiny_classifier, tf.zeros([4, 4]), tf.zeros([4], tf.int32),
                                momentum(), cpus(3))
    with v1.Session(config=v1.ConfigProto(device_count={"CPU": 1})) as sess:
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match="Cannot assign a device for operation towers_devices/CPU_1_"
                                 "exists_only_in_a_session_made_with_ConfigProto_device_count_"
                                 "CPU_3"):
            sess.run(ops.init_op)
