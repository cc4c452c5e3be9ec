"""Shared by the towers tests: a tiny model, learnable batches, a training run to compare."""

import functools

import numpy as np
import tensorflow as tf
from helpers.sessions import quick_session_config

import models
import towers

get_variable = tf.compat.v1.get_variable


def momentum():
    return tf.compat.v1.train.MomentumOptimizer(0.05, 0.9)


def tiny_classifier(features, labels, ctx):
    """4 inputs -> 3 classes, softmax regression, with an accuracy metric."""
    w = get_variable("w", [4, 3])
    b = get_variable("b", [3], initializer=tf.zeros_initializer())
    logits = tf.matmul(features, w) + b
    loss = tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    )
    hits = tf.equal(tf.argmax(logits, 1, output_type=tf.int32), labels)
    return towers.TowerOutputs(loss, {"accuracy": tf.reduce_mean(tf.cast(hits, tf.float32))})


def image_batches(spec, batch_size, steps, seed=0):
    """Learnable batches for a model's InputSpec: class = index of the largest input block."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        x = rng.normal(size=(batch_size, *spec.feature_shape)).astype(np.float32)
        y = rng.integers(0, spec.num_classes, size=batch_size).astype(np.int32)
        out.append((x, y))
    return out


def train(model_fn, devices, batches, *, mode="parameter_server", initial=None,
          optimizer=momentum, clip_norm=None, param_device="/cpu:0", **options):
    """Run len(batches) steps; return (initial values, final values) of every saved variable.

    options: more build_train_op arguments (precision, accumulate_steps, xla)."""
    graph = tf.Graph()
    with graph.as_default():
        # Seeded, so a result reproduces. Towers sum in another order than one
        # device (and oneDNN picks per-batch-size kernels), which moves values by
        # ~1e-6; about one random start in ten puts some ReLU input within that of
        # zero, the unit flips, and that step's gradient differs by ~1e-4. That is
        # the model's discontinuity, not the builder's error, so the start is fixed.
        tf.compat.v1.set_random_seed(0)
        x = tf.compat.v1.placeholder(tf.as_dtype(batches[0][0].dtype), batches[0][0].shape)
        y = tf.compat.v1.placeholder(tf.int32, batches[0][1].shape)
        ops = towers.build_train_op(model_fn, x, y, optimizer(), devices, variable_update=mode,
                                    clip_norm=clip_norm, param_device=param_device, **options)
        variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
        with tf.compat.v1.Session(config=quick_session_config(4)) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            load(sess, variables, initial or {})
            sess.run(ops.sync_op)
            start = sess.run(variables)
            for xb, yb in batches:
                sess.run(ops.train_op, {x: xb, y: yb})
            return start, sess.run(variables)


def load(sess, variables, values):
    """Set the variables named in `values` in one run (a run per variable, as
    Variable.load does, makes TensorFlow prepare a new executor for each)."""
    names = [name for name in values if name in variables]
    feeds = {name: tf.compat.v1.placeholder(variables[name].dtype.base_dtype,
                                            variables[name].shape) for name in names}
    if names:
        sess.run([variables[n].assign(feeds[n], read_value=False) for n in names],
                 {feeds[n]: values[n] for n in names})


def assert_same_variables(expected, actual, atol=1e-5):
    assert sorted(expected) == sorted(actual)
    for name in expected:
        np.testing.assert_allclose(actual[name], expected[name], atol=atol, rtol=0, err_msg=name)


def canonical(device):
    return tf.DeviceSpec.from_string(device).to_string()


def cpus(n):
    return [f"/cpu:{i}" for i in range(n)]


SMALL = {
    "mlp": {"input_dim": 12, "hidden_units": [16, 8], "num_classes": 4},
    # Dropout off: its masks are random per tower, so towers could not match one device.
    "convnet": {"num_classes": 4, "filters": [8, 16], "dense_units": 32, "dropout": 0.0},
}


@functools.cache
def one_device_run(model_name, batch_size, steps):
    """train() of SMALL[model_name] on one device: the reference many comparisons share
    (its values are read, never changed)."""
    model = models.build(model_name, SMALL[model_name])
    return train(model.model_fn, ["/cpu:0"], image_batches(model.input_spec, batch_size, steps))


def check_equivalent(model_name, num_towers, batch_size, steps=10, mode="parameter_server",
                     **options):
    """N towers (with options such as accumulate_steps) train like one device, no options."""
    model = models.build(model_name, SMALL[model_name])
    batches = image_batches(model.input_spec, batch_size, steps)
    start, single = one_device_run(model_name, batch_size, steps)
    _, multi = train(model.model_fn, cpus(num_towers), batches, mode=mode, initial=start,
                     **options)
    assert_same_variables(single, multi)
    # The runs must actually have moved the variables, or agreement proves nothing.
    assert any(not np.allclose(start[n], single[n]) for n in start if n != "global_step")


def moving_mean_model(features, labels, ctx):
    """A model whose only state update records the batch mean, as batch norm does."""
    w = get_variable("w", [4, 3])
    moving = get_variable("moving_mean", [4], initializer=tf.zeros_initializer(), trainable=False)
    tf.compat.v1.add_to_collection(
        tf.compat.v1.GraphKeys.UPDATE_OPS, moving.assign(tf.reduce_mean(features, axis=0))
    )
    logits = tf.matmul(features, w)
    return tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    )
