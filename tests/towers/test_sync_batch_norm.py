"""Synchronized batch norm: N towers normalize like one device on the whole batch.

Each check builds one step on N towers and on one device from the same start, with
SGD at rate 1 so that each variable's change is minus its gradient, and compares
the batch-norm outputs, the loss, every gradient and the moving statistics.
"""

import functools
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import cpu_session_config
from helpers.small_resnet import resnet8
from helpers.tower_training import (
    assert_same_variables,
    cpus,
    image_batches,
    load,
    train,
)

import towers
from models import keras_model, layers

get_variable = tf.compat.v1.get_variable
SGD = tf.compat.v1.train.GradientDescentOptimizer


def bn_model(captured):
    """conv -> batch norm -> relu -> conv -> batch norm -> pool -> logits; every
    normalized tensor appended to `captured` (the towers' in order)."""

    def model_fn(features, labels, ctx):
        x = layers.conv2d(features, 4, 3, scope="conv1")
        x = layers.batch_norm(x, ctx.is_training, scope="bn1", across=ctx.batch_sum)
        captured.append(x)
        x = layers.conv2d(tf.nn.relu(x), 4, 3, scope="conv2")
        x = layers.batch_norm(x, ctx.is_training, scope="bn2", across=ctx.batch_sum)
        captured.append(x)
        logits = layers.dense(layers.global_avg_pool(x), 3, scope="logits")
        return towers.TowerOutputs(layers.softmax_cross_entropy(logits, labels))

    return model_fn


def batch(size, seed=0):
    rng = np.random.default_rng(seed)
    # An offset mean: statistics of a shard then differ visibly from the batch's.
    x = (rng.normal(size=(size, 6, 6, 2)) * 2.0 + 3.0).astype(np.float32)
    return x, rng.integers(0, 3, size=size).astype(np.int32)


def one_step(devices, x, y, *, mode="parameter_server", batch_norm="sync", start=None,
             **options):
    """One SGD step (rate 1). Returns (start values, outputs, loss, gradients, moving
    statistics after the step); outputs are the batch-norm outputs in batch order."""
    captured = []
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(0)
        ops = towers.build_train_op(bn_model(captured), tf.constant(x), tf.constant(y), SGD(1.0),
                                    devices, variable_update=mode, batch_norm=batch_norm,
                                    **options)
        per_layer = len(captured) // len(devices) // options.get("accumulate_steps", 1)
        outputs = [tf.concat(captured[k::per_layer], axis=0) for k in range(per_layer)]
        variables = {v.op.name: v for v in tf.compat.v1.global_variables()
                     if v.op.name != "global_step"}
        # Grappler on, as a job runs it: its rewrites (fused batch norm with its ReLU)
        # are part of what must equal one device.
        with tf.compat.v1.Session(graph=graph, config=cpu_session_config(4)) as sess:
            sess.run(ops.init_op)
            load(sess, variables, start or {})
            sess.run(ops.sync_op)
            before = sess.run(variables)
            out, loss, _ = sess.run([outputs, ops.loss, ops.train_op])
            after = sess.run(variables)
    grads = {n: before[n] - after[n] for n in variables if "moving" not in n}
    moving = {n: after[n] for n in variables if "moving" in n}
    return before, out, loss, grads, moving


def largest_differences(reference, other):
    """The largest absolute difference per quantity: outputs, loss, gradients, moving."""
    _, out_a, loss_a, grads_a, moving_a = reference
    _, out_b, loss_b, grads_b, moving_b = other
    return {
        "outputs": max(np.abs(a - b).max() for a, b in zip(out_a, out_b, strict=True)),
        "loss": abs(loss_a - loss_b),
        "gradients": max(np.abs(grads_a[n] - grads_b[n]).max() for n in grads_a),
        "moving": max(np.abs(moving_a[n] - moving_b[n]).max() for n in moving_a),
    }


@functools.cache
def reference_step(batch_size, **options):
    """One device's step on batch(batch_size): many comparisons share one."""
    x, y = batch(batch_size)
    return one_step(["/cpu:0"], x, y, batch_norm="local", **options)


def compare(num_towers, batch_size, mode="parameter_server", batch_norm="sync", **options):
    x, y = batch(batch_size)
    reference = reference_step(batch_size, **options)
    multi = one_step(cpus(num_towers), x, y, mode=mode, batch_norm=batch_norm,
                     start=reference[0], **options)
    return largest_differences(reference, multi)


TOLERANCE = {"outputs": 1e-5, "loss": 1e-6, "gradients": 1e-5, "moving": 1e-6}


def assert_within_tolerance(differences):
    for quantity, limit in TOLERANCE.items():
        assert differences[quantity] < limit, (quantity, differences)


@pytest.mark.parametrize("mode", ["parameter_server", "replicated"])
@pytest.mark.parametrize("num_towers", [2, 3, 4])
def test_sync_towers_compute_what_one_device_computes_on_the_whole_batch(num_towers, mode):
    assert_within_tolerance(compare(num_towers, 12, mode))


@pytest.mark.parametrize("mode", ["parameter_server", "replicated"])
def test_an_uneven_split_is_merged_by_example_count(mode):
    assert_within_tolerance(compare(3, 10, mode))  # 4, 3 and 3 examples


@pytest.mark.parametrize("num_towers, batch_size", [(2, 12), (3, 10)])
def test_a_mean_large_against_the_spread_keeps_every_digit(num_towers, batch_size):
    # Mean 200, spread 0.5: float32 sums of x and x^2 would leave the variance about 1%
    # off (E[x^2] - E[x]^2 cancels 5 of its 7 digits); the towers' merged statistics
    # are as exact as one device's.
    x, y = batch(batch_size)
    x = (x - 3.0) / 4.0 + 200.0
    reference = one_step(["/cpu:0"], x, y, batch_norm="local")
    multi = one_step(cpus(num_towers), x, y, start=reference[0])
    differences = largest_differences(reference, multi)
    for quantity in ("outputs", "loss", "gradients"):
        assert differences[quantity] < TOLERANCE[quantity], differences
    for name, value in reference[4].items():  # the moving mean is near 20 here
        np.testing.assert_allclose(multi[4][name], value, rtol=1e-5, err_msg=name)


def test_local_towers_normalize_by_their_own_shard_and_differ():
    # The comparison can fail: each shard's statistics are not the batch's.
    differences = compare(2, 12, batch_norm="local")
    assert differences["outputs"] > 1e-2 and differences["gradients"] > 1e-3


def test_accumulated_micro_batches_are_normalized_one_at_a_time():
    # One device with 2 micro-batches normalizes each by its own statistics;
    # so do 2 synchronized towers with 2 micro-batches (each of 2 towers).
    assert_within_tolerance(compare(2, 12, accumulate_steps=2))


def test_statistics_stay_float32_in_mixed_precision(graph):
    x, y = batch(8)
    towers.build_train_op(bn_model([]), tf.constant(x), tf.constant(y), SGD(1.0), cpus(2),
                          precision="mixed_bfloat16", batch_norm="sync")
    reduced = [op for op in graph.get_operations() if op.type == "CollectiveReduceV2"]
    assert reduced and {op.inputs[0].dtype for op in reduced} == {tf.float32}
    moving = [v for v in tf.compat.v1.global_variables() if "moving" in v.op.name]
    assert moving and {v.dtype.base_dtype for v in moving} == {tf.float32}


@pytest.mark.parametrize("precision", ["mixed_bfloat16", "mixed_float16"])
def test_sync_towers_in_16_bits_stay_near_one_device(precision):
    # 16-bit activations round differently on 1 and 2 devices (gradients to 1e-3); the
    # float32 statistics agree as in float32 (local towers: 4e-2).
    differences = compare(2, 12, precision=precision)
    assert differences["moving"] < 1e-5 and differences["loss"] < 1e-4, differences


def test_sync_and_local_make_the_same_variables():
    # So a checkpoint written with one restores with the other.
    names = {}
    for batch_norm in ("local", "sync"):
        with tf.Graph().as_default():
            x, y = batch(8)
            towers.build_train_op(bn_model([]), tf.constant(x), tf.constant(y), SGD(1.0),
                                  cpus(2), batch_norm=batch_norm)
            names[batch_norm] = sorted(v.op.name for v in tf.compat.v1.global_variables())
    assert names["local"] == names["sync"]


def test_an_unknown_batch_norm_is_refused(graph):
    x, y = batch(8)
    with pytest.raises(ValueError, match="batch_norm must be one of local, sync"):
        towers.build_train_op(bn_model([]), tf.constant(x), tf.constant(y), SGD(1.0),
                              cpus(2), batch_norm="global")


def test_the_built_in_resnet_trains_with_sync_towers_like_one_device():
    # The built-in model's code passes its towers' sums to every batch norm (at depth 8:
    # each kind of block resnet20 has, in a third of its graph); weight decay, momentum
    # and 2 steps on 3 + 2 examples: the moving statistics and every variable agree.
    model = resnet8()
    batches = image_batches(model.input_spec, 5, 2)
    start, single = train(model.model_fn, ["/cpu:0"], batches, batch_norm="local")
    _, multi = train(model.model_fn, cpus(2), batches, batch_norm="sync", initial=start)
    assert_same_variables(single, multi)


# --- Keras ---------------------------------------------------------------------------------


def keras_bn_model(synchronized):
    """A compiled Keras convnet with one BatchNormalization, made in every tower (towers
    runs tower 0's moving-statistics updates)."""
    def model_fn(features, labels, ctx):
        net = keras.Sequential([
            keras.layers.Conv2D(4, 3),
            keras.layers.BatchNormalization(synchronized=synchronized),
            keras.layers.ReLU(), keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3),
        ])
        net.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return keras_model.tower_outputs(net, features, labels, ctx)

    return model_fn


KERAS_BATCHES = [batch(10), batch(10, seed=1)]


@functools.cache
def keras_one_device(synchronized):
    """(start, final values) of 2 steps on one device: the reference both modes share."""
    keras.utils.clear_session()  # Keras names its layers afresh in each graph
    return train(keras_bn_model(synchronized), ["/cpu:0"], KERAS_BATCHES,
                 optimizer=lambda: SGD(0.5), batch_norm="local")


def keras_largest_differences(synchronized, batch_norm, num_towers, mode="parameter_server"):
    """Largest difference from one device over 2 steps: of any variable, and of the moving
    statistics alone."""
    start, single = keras_one_device(synchronized)
    keras.utils.clear_session()
    _, multi = train(keras_bn_model(synchronized), cpus(num_towers), KERAS_BATCHES, mode=mode,
                     optimizer=lambda: SGD(0.5), batch_norm=batch_norm, initial=start)
    assert sorted(single) == sorted(multi)
    moving = [n for n in single if "moving" in n]
    assert moving
    return (max(np.abs(single[n] - multi[n]).max() for n in single),
            max(np.abs(single[n] - multi[n]).max() for n in moving))


@pytest.mark.parametrize("mode", ["parameter_server", "replicated"])
def test_keras_synchronized_batch_norm_normalizes_by_the_whole_batch(mode):
    # Synchronized whatever towers.batch_norm says: the layer asks for it.
    assert max(keras_largest_differences(True, "local", 3, mode)) < 1e-5


def test_a_plain_keras_batch_norm_is_synchronized_by_batch_norm_sync():
    # batch_norm="sync" synchronizes every batch norm, a Keras model's plain ones too (a
    # keras.applications model has nothing else), with nothing to warn about.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert max(keras_largest_differences(False, "sync", 2)) < 1e-5


def test_a_plain_keras_batch_norm_keeps_its_towers_statistics_under_local():
    assert keras_largest_differences(False, "local", 2)[1] > 1e-3


def test_sync_with_no_batch_norm_to_synchronize_is_told():
    def no_batch_norm(features, labels, ctx):
        logits = layers.dense(layers.global_avg_pool(features), 3, scope="logits")
        return towers.TowerOutputs(layers.softmax_cross_entropy(logits, labels))

    with pytest.warns(UserWarning, match="batch_norm='sync': the model computed no statistic"):
        train(no_batch_norm, cpus(2), [batch(10)], batch_norm="sync")


def test_on_gpus_each_towers_statistics_are_summed_on_its_own_gpu(graph):
    # Built, never run (no GPU here): every collective, forward and backward, runs on
    # its tower's GPU, where TensorFlow's collectives use NCCL.
    x, y = batch(8)
    towers.build_train_op(bn_model([]), tf.constant(x), tf.constant(y), SGD(1.0),
                          ["/gpu:0", "/gpu:1"], batch_norm="sync")
    gathered = [op for op in graph.get_operations() if op.type == "CollectiveGatherV2"]
    reduced = [op for op in graph.get_operations() if op.type == "CollectiveReduceV2"]
    # One collective per layer and tower each way: the statistics gathered forward, the
    # gradients of mean and variance summed backward.
    assert len(gathered) == len(reduced) == 2 * 2  # layers x towers
    for op in gathered + reduced:
        tower = int(op.name.split("/")[0].removeprefix("tower_"))
        assert tf.DeviceSpec.from_string(op.device).device_index == tower, op.name
        assert tf.DeviceSpec.from_string(op.device).device_type == "GPU", op.name
