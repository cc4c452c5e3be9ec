"""Mixed precision: float32 variables read through casts, 16-bit gradients, loss scaling."""

import numpy as np
import pytest
import tensorflow as tf
from conftest import cpu_session_config
from helpers.tower_training import (
    SMALL,
    cpus,
    get_variable,
    image_batches,
    load,
    momentum,
    tiny_classifier,
)

import models
import towers

PRECISIONS = towers.PRECISIONS


def sixteen_bit_classifier(features, labels, ctx):
    """tiny_classifier written for mixed precision: variables in its input's type."""
    w = get_variable("w", [4, 3], dtype=features.dtype)
    b = get_variable("b", [3], dtype=features.dtype, initializer=tf.zeros_initializer())
    logits = tf.cast(tf.matmul(features, w) + b, tf.float32)
    return tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))


def saved_variables(precision, model_name="convnet"):
    """{name: (dtype, shape)} of what a checkpoint of this precision would hold."""
    graph = tf.Graph()
    with graph.as_default():
        model = models.build(model_name, SMALL.get(model_name, {"image_size": 8}))
        x = tf.zeros([4, *model.input_spec.feature_shape])
        towers.build_train_op(model.model_fn, x, tf.zeros([4], tf.int32), momentum(), cpus(2),
                              precision=precision)
        return {v.op.name: (v.dtype.base_dtype, tuple(v.shape))
                for v in tf.compat.v1.global_variables()}


@pytest.mark.parametrize("model_name, precisions", [
    ("convnet", PRECISIONS),
    # Batch norm asks for float32 itself: one 16-bit type shows it stays so.
    ("resnet20", ("float32", "mixed_bfloat16")),
])
def test_checkpoints_hold_the_same_float32_variables_in_every_precision(model_name, precisions):
    found = {p: saved_variables(p, model_name) for p in precisions}
    assert all(variables == found["float32"] for variables in found.values())
    assert {dtype for dtype, _ in found["float32"].values()} <= {tf.float32, tf.int64}


def sgd_step(precision, devices=("/cpu:0",), model_fn=sixteen_bit_classifier, batch=None,
             steps=1, rate=1.0, initial=None, **kwargs):
    """Variables after `steps` SGD steps from a fixed start (or `initial`); the TrainOps'
    values of each step; the loss scale after the last."""
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(0)
        xb, yb = batch or image_batches(models.InputSpec((4,), tf.float32, (), tf.int32, 3),
                                        8, 1)[0]
        ops = towers.build_train_op(model_fn, tf.constant(xb), tf.constant(yb),
                                    tf.compat.v1.train.GradientDescentOptimizer(rate),
                                    list(devices), precision=precision, **kwargs)
        fetch = {k: v for k, v in ops._asdict().items()
                 if k in ("loss", "all_finite", "loss_scale", "overflow") and v is not None}
        with tf.compat.v1.Session(config=cpu_session_config(len(devices))) as sess:
            sess.run(ops.init_op)
            load(sess, {v.op.name: v for v in tf.compat.v1.trainable_variables()},
                 initial or {})
            sess.run(ops.sync_op)
            start = sess.run({v.op.name: v for v in tf.compat.v1.trainable_variables()})
            # Fetched with the step: fetching all_finite (the step's cond) runs the update.
            seen = [sess.run([ops.train_op, fetch])[1] for _ in range(steps)]
            end = sess.run({v.op.name: v for v in tf.compat.v1.trainable_variables()})
            after = sess.run(ops.loss_scale) if ops.loss_scale is not None else None
    return start, end, seen, after


@pytest.mark.parametrize("precision", ["mixed_bfloat16", "mixed_float16"])
def test_a_16_bit_step_is_the_float32_step_within_the_types_precision(precision):
    start, single, _, _ = sgd_step("float32")
    _, mixed, _, _ = sgd_step(precision, initial=start)
    for name in start:
        moved = np.abs(single[name] - start[name]).max()
        assert moved > 1e-2
        # bfloat16 keeps 8 significant bits, float16 11: within a few units in the last place.
        tolerance = moved * (2**-5 if precision == "mixed_bfloat16" else 2**-8)
        np.testing.assert_allclose(mixed[name], single[name], atol=tolerance, rtol=0,
                                   err_msg=name)


@pytest.mark.parametrize("mode", ["parameter_server", "replicated"])
@pytest.mark.parametrize("gradient_dtype", ["bfloat16", "float16"])
def test_16_bit_gradients_match_float32_gradients_within_their_precision(mode, gradient_dtype):
    devices = cpus(2)
    start, plain, _, _ = sgd_step("float32", devices, tiny_classifier, variable_update=mode)
    sixteen = towers.Precision("float32", gradient_dtype=gradient_dtype)
    _, sent, _, _ = sgd_step(sixteen, devices, tiny_classifier, variable_update=mode,
                             initial=start)
    for name in start:
        moved = np.abs(plain[name] - start[name]).max()
        tolerance = moved * (2**-7 if gradient_dtype == "bfloat16" else 2**-10)
        np.testing.assert_allclose(sent[name], plain[name], atol=tolerance, rtol=0, err_msg=name)
        assert not np.array_equal(sent[name], plain[name]) or gradient_dtype == "float16"


def crossing_dtypes(graph):
    """The types of every tensor an op on one device hands to an op on another device."""
    canonical = {}

    def device(op):
        return canonical.setdefault(op.device, tf.DeviceSpec.from_string(op.device).to_string())

    return {t.dtype.base_dtype for op in graph.get_operations() for t in op.inputs
            if t.op.device and op.device and device(t.op) != device(op)
            and t.dtype.is_floating and t.op.type not in ("ReadVariableOp", "VarHandleOp")
            and op.type not in ("ReadVariableOp",)}


@pytest.mark.parametrize("mode", ["parameter_server", "replicated"])
def test_16_bit_gradients_cross_devices_in_16_bits(graph, mode):
    x, y = tf.zeros([8, 4]), tf.zeros([8], tf.int32)
    with tf.name_scope("sixteen"):
        towers.build_train_op(tiny_classifier, x, y, momentum(), cpus(2), variable_update=mode,
                              precision=towers.Precision(gradient_dtype="bfloat16"))
    gradients = [t for op in graph.get_operations() if "/send/" in op.name for t in op.outputs]
    assert gradients and {t.dtype for t in gradients} == {tf.bfloat16}


def test_a_huge_loss_scale_skips_steps_halves_and_training_recovers():
    scale = towers.DynamicLossScale(initial=2.0**30, growth_steps=3)
    precision = towers.Precision("mixed_float16", loss_scale=scale)
    start, end, seen, after = sgd_step(precision, steps=20, rate=0.5, nonfinite="raise")
    skipped = [s for s in seen if s["overflow"]]
    assert 3 <= len(skipped) <= 25 and all(not s["all_finite"] for s in skipped)
    # Halved on each overflow, from the start, before the first applied step.
    assert [s["loss_scale"] for s in skipped] == [2.0**30 / 2**i for i in range(len(skipped))]
    assert seen[: len(skipped)] == skipped
    applied = seen[len(skipped):]
    assert applied and all(s["all_finite"] and not s["overflow"] for s in applied)
    assert applied[-1]["loss"] < applied[0]["loss"]  # training recovered and learns
    # growth_steps finite steps in a row double the scale again (unless that overflows).
    assert max(s["loss_scale"] for s in applied) > applied[0]["loss_scale"]


def test_overflow_steps_change_nothing_but_the_step_and_the_scale():
    precision = towers.Precision("mixed_float16", loss_scale=towers.DynamicLossScale(2.0**40))
    start, end, seen, scale = sgd_step(precision, steps=2, nonfinite="raise")
    assert [s["overflow"] for s in seen] == [True, True]
    for name in start:
        np.testing.assert_array_equal(end[name], start[name], err_msg=name)
    assert scale == 2.0**38


def sqrt_at_zero(features, labels, ctx):
    """A finite loss whose gradient is infinite at any scale: d sqrt(w) / dw at w = 0."""
    w = get_variable("w", [], dtype=features.dtype, initializer=tf.zeros_initializer())
    return tf.cast(tf.sqrt(w), tf.float32) + 0.0 * tf.reduce_mean(tf.cast(features, tf.float32))


def test_a_gradient_still_infinite_at_the_smallest_scale_is_divergence():
    scale = towers.DynamicLossScale(initial=4.0, minimum=1.0)
    precision = towers.Precision("mixed_float16", loss_scale=scale)
    with pytest.raises(tf.errors.InvalidArgumentError, match=towers.NONFINITE_GRADIENT):
        sgd_step(precision, model_fn=sqrt_at_zero, steps=3, nonfinite="raise")
    _, _, seen, _ = sgd_step(precision, model_fn=sqrt_at_zero, steps=2, nonfinite="raise")
    assert [s["overflow"] for s in seen] == [True, True]  # 4 -> 2 -> 1: overflows, no error


def test_a_nan_loss_under_loss_scaling_is_divergence_not_overflow():
    xb, yb = image_batches(models.InputSpec((4,), tf.float32, (), tf.int32, 3), 8, 1)[0]
    xb[3, 1] = np.nan
    # Both checks fail (the gradient is NaN too); whichever runs first names itself.
    either = f"{towers.NONFINITE_LOSS}|{towers.NONFINITE_GRADIENT}"
    with pytest.raises(tf.errors.InvalidArgumentError, match=either):
        sgd_step("mixed_float16", batch=(xb, yb), nonfinite="raise")
    _, _, seen, _ = sgd_step("mixed_float16", batch=(xb, yb), nonfinite="skip")
    assert not seen[0]["overflow"] and not seen[0]["all_finite"]


def test_loss_scale_state_stays_out_of_checkpoints(graph):
    towers.build_train_op(tiny_classifier, tf.zeros([8, 4]), tf.zeros([8], tf.int32), momentum(),
                          cpus(1), precision="mixed_float16")
    local = {v.op.name for v in tf.compat.v1.local_variables()}
    assert local == {"loss_scale/loss_scale", "loss_scale/good_steps"}
    assert not local & {v.op.name for v in tf.compat.v1.global_variables()}


@pytest.mark.parametrize("kwargs, message", [
    ({"precision": "float8"}, "precision must be one of"),
    ({"precision": "mixed_bfloat16", "accumulate_steps": 1.5},
     "accumulate_steps must be a positive integer"),
])
def test_bad_precision_arguments_are_clear_errors(graph, kwargs, message):
    with pytest.raises(ValueError, match=message):
        towers.build_train_op(tiny_classifier, tf.zeros([8, 4]), tf.zeros([8], tf.int32),
                              momentum(), cpus(1), **kwargs)


def test_a_loss_scale_is_for_float16_only():
    with pytest.raises(ValueError, match="loss_scale is for mixed_float16 only"):
        towers.Precision("mixed_bfloat16", loss_scale=towers.DynamicLossScale())
    with pytest.raises(ValueError, match="gradient_dtype must be one of"):
        towers.Precision(gradient_dtype="int8")


def keras_synchronized(features, labels, ctx):
    """A Keras dense layer and a synchronized batch norm, the loss in float32 (as a model
    written for mixed precision computes it)."""
    import keras

    keras.src.utils.naming.reset_uids()
    h = keras.layers.Dense(5, use_bias=False)(features)
    h = keras.layers.BatchNormalization(synchronized=True, momentum=0.5)(h, training=True)
    logits = keras.layers.Dense(3)(tf.tanh(h))
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=logits))


def test_float64_towers_equal_one_device_to_float64_rounding():
    # FLOAT64 (towers verify's): every variable float64, Keras layers too, the moments
    # of a synchronized batch norm and the towers' weights 4/10 and 3/10 (no float32 can
    # hold them) as well: three towers on 10 examples land within float64's rounding.
    batch = image_batches(models.InputSpec((4,), tf.float64, (), tf.int32, 3), 10, 1)[0]
    run = dict(model_fn=keras_synchronized, batch=batch, steps=3, rate=0.3,
               batch_norm="sync", variable_update="replicated")
    start, one, _, _ = sgd_step(towers.Precision(towers.FLOAT64), **run)
    _, three, _, _ = sgd_step(towers.Precision(towers.FLOAT64), cpus(3), initial=start, **run)
    assert {v.dtype for v in start.values()} == {np.dtype(np.float64)}
    for name in start:
        assert np.abs(one[name] - start[name]).max() > 1e-2, name
        np.testing.assert_allclose(three[name], one[name], atol=1e-14, rtol=0, err_msg=name)
