"""A compiled Keras model as tower outputs: its loss, metrics, predictions and state."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from models import keras_model
from towers import TowerContext

v1 = tf.compat.v1
CTX = TowerContext(0, 1, "/cpu:0", True)


def classifier(**compile_args):
    net = keras.Sequential([keras.layers.Dense(3)])
    net.compile(**compile_args)
    return net


def run(outputs, x, y):
    with v1.Session() as sess:
        sess.run(v1.global_variables_initializer())
        return sess.run(outputs, {"x:0": x, "y:0": y})


def inputs():
    return v1.placeholder(tf.float32, [None, 4], name="x"), v1.placeholder(tf.int32, [None],
                                                                         name="y")


def test_loss_metrics_and_probabilities_follow_compile(keras_graph):
    x, y = inputs()
    net = classifier(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                     metrics=["accuracy", "sparse_top_k_categorical_accuracy",
                              keras.metrics.SparseCategoricalAccuracy(name="acc2")])
    outputs = keras_model.tower_outputs(net, x, y, CTX)
    logits = net(x)
    xs = np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32)
    ys = np.array([0, 1, 2, 0, 1, 2], np.int32)
    got, scores = run([outputs, logits], xs, ys)
    probabilities = np.exp(scores) / np.exp(scores).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(got.predictions, probabilities, rtol=1e-5)
    expected_loss = -np.mean(np.log(probabilities[np.arange(6), ys]))
    assert got.loss == pytest.approx(expected_loss, rel=1e-5)
    accuracy = np.mean(np.argmax(scores, axis=1) == ys)
    assert got.metrics["accuracy"] == pytest.approx(accuracy)
    assert got.metrics["acc2"] == pytest.approx(accuracy)
    assert got.metrics["sparse_top_k_categorical_accuracy"] == 1.0  # k=5 of 3 classes


def test_a_loss_on_probabilities_serves_the_outputs_as_they_are(keras_graph):
    x, y = inputs()
    net = keras.Sequential([keras.layers.Dense(3, activation="softmax")])
    net.compile(loss="sparse_categorical_crossentropy")
    outputs = keras_model.tower_outputs(net, x, y, CTX)
    assert outputs.predictions.op.type == "Softmax"  # the model's own, not one added


def test_layer_penalties_join_the_loss(keras_graph):
    x, y = inputs()
    net = keras.Sequential([keras.layers.Dense(3, kernel_regularizer=keras.regularizers.L2(1.0))])
    net.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    plain = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, net(x))
    outputs = keras_model.tower_outputs(net, x, y, CTX)
    kernel = net.weights[0].value
    got, base, w = run([outputs.loss, plain, kernel], np.ones((2, 4), np.float32), [0, 1])
    assert got == pytest.approx(base + np.sum(w**2), rel=1e-5)


def test_compile_state_leaves_checkpoints(keras_graph):
    x, y = inputs()
    net = keras.Sequential([keras.layers.Dense(3), keras.layers.BatchNormalization()])
    net.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=True))
    keras_model.tower_outputs(net, x, y, CTX)
    names = [v.op.name for v in v1.global_variables()]
    assert "sequential/batch_normalization/moving_mean" in names
    assert not any(n.startswith(("adam", "loss")) for n in names), names


@pytest.mark.parametrize("compile_args, message", [
    ({}, "not compiled with a loss"),
    ({"loss": keras.losses.SparseCategoricalCrossentropy(reduction="sum")}, "reduction"),
    ({"loss": "mse", "metrics": ["no_such_metric"]}, "no_such_metric"),
    ({"loss": "mse", "metrics": [keras.metrics.AUC()]}, "not a mean"),
])
def test_what_towers_cannot_train_says_why(keras_graph, compile_args, message):
    x, y = inputs()
    net = keras.Sequential([keras.layers.Dense(3)])
    if compile_args:
        net.compile(**compile_args)
    with pytest.raises(keras_model.KerasModelError, match=message):
        keras_model.tower_outputs(net, x, y, CTX)


def test_a_model_computing_in_another_type_than_the_towers_is_refused(keras_graph):
    x, y = inputs()
    net = classifier(loss="sparse_categorical_crossentropy")  # float32: made outside towers
    bfloat16 = TowerContext(0, 1, "/cpu:0", True, compute_dtype=tf.bfloat16)
    with pytest.raises(keras_model.KerasModelError,
                       match="computes in float32 but the towers compute in bfloat16"):
        keras_model.tower_outputs(net, x, y, bfloat16)
