"""The models package: every model learns, returns scalar means, shares its variables
between towers, leaves device placement to the builder; the registry rejects bad
configurations with one clear line."""

import contextlib

import numpy as np
import pytest
import tensorflow as tf
from helpers.sessions import without_rewriting

import models
import towers
from models import layers
from towers import TowerContext, TowerOutputs

v1 = tf.compat.v1
UPDATE_OPS = v1.GraphKeys.UPDATE_OPS

# Small sizes of every model, so each test builds and runs in about a second.
SMALL = {
    "mlp": {"input_dim": 20, "hidden_units": [32, 16], "num_classes": 3},
    "convnet": {
        "image_size": 12,
        "filters": [4, 8],
        "kernel_size": 3,
        "dense_units": 32,
        "num_classes": 3,
        "dropout": 0.1,
    },
    "resnet20": {"image_size": 8, "base_filters": 4, "num_classes": 3},
    "resnet56": {"image_size": 8, "base_filters": 4, "num_classes": 3},
    "lstm_lm": {"vocab_size": 50, "num_steps": 10, "hidden_size": 32},
}
# resnet56 is resnet20's builder with 9 residual blocks per stage instead of 3, and the
# costliest graph of all to build: the tests below that rebuild every model several times
# take resnet20 for both (test_outputs_are_scalar_means still builds and runs resnet56).
BUT_RESNET56 = [name for name in models.names() if name != "resnet56"]
METRICS = {
    "mlp": {"accuracy"},
    "convnet": {"accuracy"},
    "resnet20": {"accuracy"},
    "resnet56": {"accuracy"},
    "lstm_lm": {"accuracy", "perplexity"},
}


def _ctx(is_training: bool, num_examples=None) -> TowerContext:
    return TowerContext(
        index=0, num_towers=1, device="/cpu:0", is_training=is_training, num_examples=num_examples
    )


def _session(graph: tf.Graph) -> v1.Session:
    """A session without graph rewriting (small graphs, few steps)."""
    return v1.Session(graph=graph, config=without_rewriting(
        v1.ConfigProto(intra_op_parallelism_threads=2, inter_op_parallelism_threads=2)))


def _data(model: models.Model, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """n learnable examples for the model's input spec.

    Classifiers: Gaussian features labelled by the argmax of a fixed random linear
    projection. LM: token sequences following a fixed random permutation of the
    vocabulary (next = perm[current]), so every next token is predictable but the
    unigram distribution is uniform: the loss can only fall by learning transitions.
    """
    rng = np.random.default_rng(seed)
    spec = model.input_spec
    if spec.feature_dtype == tf.int32:
        perm = rng.permutation(spec.num_classes)
        seq = np.empty((n, spec.feature_shape[0] + 1), np.int32)
        seq[:, 0] = rng.integers(0, spec.num_classes, n)
        for t in range(1, seq.shape[1]):
            seq[:, t] = perm[seq[:, t - 1]]
        return seq[:, :-1], seq[:, 1:]
    x = rng.normal(size=(n, *spec.feature_shape)).astype(np.float32)
    projection = rng.normal(size=(x[0].size, spec.num_classes))
    y = np.argmax(x.reshape(n, -1) @ projection, axis=1).astype(np.int32)
    return x, y


def _placeholders(model: models.Model) -> tuple[tf.Tensor, tf.Tensor]:
    spec = model.input_spec
    features = v1.placeholder(spec.feature_dtype, (None, *spec.feature_shape), "features")
    labels = v1.placeholder(spec.label_dtype, (None, *spec.label_shape), "labels")
    return features, labels


def _build(model: models.Model, is_training: bool) -> tuple[tf.Tensor, tf.Tensor, TowerOutputs]:
    features, labels = _placeholders(model)
    outputs = model.model_fn(features, labels, _ctx(is_training, tf.shape(features)[0]))
    return features, labels, outputs


# --- every model learns --------------------------------------------------------------

TRAINING = [  # name, examples, steps, Adam learning rate
    ("mlp", 64, 40, 0.01),
    ("convnet", 32, 40, 0.01),
    ("resnet20", 16, 25, 0.01),
    ("lstm_lm", 16, 60, 0.02),
]


@pytest.mark.parametrize("name, n, steps, learning_rate", TRAINING)
def test_model_trains(graph, name, n, steps, learning_rate):
    v1.set_random_seed(0)
    model = models.build(name, SMALL[name])
    x, y = _data(model, n)
    features, labels, outputs = _build(model, is_training=True)
    with tf.control_dependencies(v1.get_collection(UPDATE_OPS)):
        train_op = v1.train.AdamOptimizer(learning_rate).minimize(outputs.loss)
    feed = {features: x, labels: y}
    with _session(graph) as sess:
        sess.run(v1.global_variables_initializer())
        initial = sess.run(outputs.loss, feed)
        for _ in range(steps):
            sess.run(train_op, feed)
        final, metrics = sess.run([outputs.loss, outputs.metrics], feed)
    assert final < 0.5 * initial, f"{name}: loss {initial:.3f} -> {final:.3f}"
    assert metrics["accuracy"] > 0.8, f"{name}: accuracy {metrics['accuracy']:.3f}"


# --- outputs ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", models.names())
@pytest.mark.parametrize("is_training", [True, False])
def test_outputs_are_scalar_means(graph, name, is_training):
    model = models.build(name, SMALL[name])
    features, labels, outputs = _build(model, is_training)
    assert isinstance(outputs, TowerOutputs)
    assert set(outputs.metrics) == METRICS[name]
    for tensor in [outputs.loss, *outputs.metrics.values()]:
        assert tensor.shape == (), tensor
        assert tensor.dtype == tf.float32, tensor
    x, y = _data(model, 3)
    with _session(graph) as sess:
        sess.run(v1.global_variables_initializer())
        loss, metrics = sess.run([outputs.loss, outputs.metrics], {features: x, labels: y})
    assert np.isfinite(loss) and loss > 0
    assert 0.0 <= metrics["accuracy"] <= 1.0
    if "perplexity" in metrics:
        np.testing.assert_allclose(metrics["perplexity"], np.exp(loss), rtol=1e-5)


@pytest.mark.parametrize("name", BUT_RESNET56)
def test_eval_loss_is_mean_over_examples(graph, name):
    """So the builder can weight towers by their example counts. For ResNet this
    also shows evaluation uses moving statistics: with batch statistics an
    example's loss would depend on the rest of its batch."""
    model = models.build(name, SMALL[name])
    features, labels, outputs = _build(model, is_training=False)
    x, y = _data(model, 4)
    with _session(graph) as sess:
        sess.run(v1.global_variables_initializer())
        whole = sess.run(outputs.loss, {features: x, labels: y})
        single = [
            sess.run(outputs.loss, {features: x[i : i + 1], labels: y[i : i + 1]}) for i in range(4)
        ]
    np.testing.assert_allclose(whole, np.mean(single), rtol=1e-4)


def test_resnet_weight_decay_is_added_into_the_loss(graph):
    """Two ResNets on the same variables, without and with weight decay: the losses
    differ by rate * sum(||k||^2) / 2 over the 20 weighted layers' kernels."""
    rate = 0.01
    plain = models.build("resnet20", {**SMALL["resnet20"], "weight_decay": 0.0})
    decayed = models.build("resnet20", {**SMALL["resnet20"], "weight_decay": rate})
    features, labels = _placeholders(plain)
    ctx = _ctx(is_training=False)
    with v1.variable_scope("net"):
        plain_loss = plain.model_fn(features, labels, ctx).loss
    with v1.variable_scope("net", reuse=True):
        decayed_loss = decayed.model_fn(features, labels, ctx).loss
    kernels = [v for v in v1.trainable_variables() if v.op.name.endswith("/kernel")]
    assert len(kernels) == 20  # ResNet-20: 19 convolutions and the dense layer
    x, y = _data(plain, 4)
    with _session(graph) as sess:
        sess.run(v1.global_variables_initializer())
        losses = sess.run([plain_loss, decayed_loss], {features: x, labels: y})
        squares = sum(np.sum(k**2) for k in sess.run(kernels))
    np.testing.assert_allclose(losses[1] - losses[0], rate * squares / 2, rtol=1e-3)


# --- batch norm ------------------------------------------------------------------------


def _moving_statistics() -> list[tf.Variable]:
    return [v for v in v1.global_variables() if "moving_" in v.op.name]


def test_resnet_batch_norm_training_updates_moving_statistics(graph):
    model = models.build("resnet20", SMALL["resnet20"])
    _build(model, is_training=True)
    moving = _moving_statistics()
    # Stem plus two per block (3 stages x 3 blocks), a mean and a variance each.
    assert len(moving) == 2 * (1 + 2 * 9)
    assert not set(moving) & set(v1.trainable_variables())
    update_ops = v1.get_collection(UPDATE_OPS)
    assert len(update_ops) == len(moving)
    assert all(isinstance(op, tf.Operation) for op in update_ops)
    assigned = {op.inputs[0].op.name for op in update_ops}  # the variables' handles
    assert assigned == {v.op.name for v in moving}


def test_resnet_batch_norm_eval_adds_no_updates_and_reads_moving_statistics(graph):
    model = models.build("resnet20", SMALL["resnet20"])
    features, labels, outputs = _build(model, is_training=False)
    assert v1.get_collection(UPDATE_OPS) == []
    moving_means = [v for v in _moving_statistics() if v.op.name.endswith("moving_mean")]
    x, y = _data(model, 4)
    feed = {features: x, labels: y}
    with _session(graph) as sess:
        sess.run(v1.global_variables_initializer())
        before = sess.run(outputs.loss, feed)
        sess.run([v.assign(v + 0.5) for v in moving_means])
        after = sess.run(outputs.loss, feed)
    assert abs(after - before) > 1e-3


def _variables_as(dtype: tf.DType):
    """float32: get_variable as it is; float64: every float variable float64, as towers
    verify's precision (towers.FLOAT64) makes them."""
    if dtype == tf.float32:
        return contextlib.nullcontext()
    getter = towers.Precision(towers.FLOAT64).wrap_getter(
        lambda get, name, *args, **kwargs: get(name, *args, **kwargs), "")
    return v1.variable_scope("", custom_getter=getter)


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
def test_batch_norm_layer(graph, dtype):
    """Training: normalize by batch statistics and move the averages by 1 - decay.
    Evaluation: normalize by the moving averages. In float64 (towers verify's) too,
    which the fused kernel does not compute."""
    x_value = np.random.default_rng(0).normal(3.0, 2.0, size=(8, 3)).astype(dtype.name)
    x = tf.constant(x_value)
    with _variables_as(dtype):
        train_y = layers.batch_norm(x, is_training=True, decay=0.9, epsilon=1e-5, scope="bn")
    updates = v1.get_collection(UPDATE_OPS)
    with _variables_as(dtype), v1.variable_scope("", reuse=True):
        eval_y = layers.batch_norm(x, is_training=False, decay=0.9, epsilon=1e-5, scope="bn")
    assert train_y.dtype == eval_y.dtype == dtype
    assert len(v1.get_collection(UPDATE_OPS)) == 2
    variables = {v.op.name: v for v in v1.global_variables()}
    mean, variance = variables["bn/moving_mean"], variables["bn/moving_variance"]
    with _session(graph) as sess:
        sess.run(v1.global_variables_initializer())
        y = sess.run(train_y)
        sess.run(updates)
        moving_mean, moving_variance, y_eval = sess.run([mean, variance, eval_y])
    np.testing.assert_allclose(y.mean(axis=0), 0.0, atol=1e-5)
    np.testing.assert_allclose(y.std(axis=0), 1.0, atol=1e-3)
    np.testing.assert_allclose(moving_mean, 0.1 * x_value.mean(axis=0), rtol=1e-5)
    # The fused kernel reports the unbiased (n - 1) batch variance for the average.
    expected_variance = 0.9 + 0.1 * x_value.var(axis=0, ddof=1)
    np.testing.assert_allclose(moving_variance, expected_variance, rtol=1e-5)
    expected_eval = (x_value - moving_mean) / np.sqrt(moving_variance + 1e-5)
    np.testing.assert_allclose(y_eval, expected_eval, rtol=1e-4, atol=1e-5)


# --- other layers ----------------------------------------------------------------------


def test_embedding_gradient_is_indexed_slices(graph):
    vectors = layers.embedding(tf.constant([[1, 2], [2, 3]]), vocab_size=10, dim=4)
    assert vectors.shape == (2, 2, 4)
    (table,) = v1.trainable_variables()
    (gradient,) = tf.gradients(tf.reduce_sum(vectors), [table])
    assert isinstance(gradient, tf.IndexedSlices)


def test_lstm_shapes_and_forget_bias(graph):
    outputs = layers.lstm(tf.zeros([2, 5, 3]), hidden=4, scope="lstm")
    assert outputs.shape == (2, 5, 4)
    kernel, bias = v1.trainable_variables()
    assert kernel.shape == (3 + 4, 16) and bias.shape == (16,)
    with _session(graph) as sess:
        sess.run(v1.global_variables_initializer())
        bias_value = sess.run(bias)
    np.testing.assert_array_equal(bias_value, [0] * 4 + [1] * 4 + [0] * 8)  # gates i, f, g, o


# --- towers can share the model ---------------------------------------------------------


@pytest.mark.parametrize("name", BUT_RESNET56)
def test_rebuilding_with_reuse_creates_no_variables(graph, name):
    model = models.build(name, SMALL[name])
    with v1.variable_scope("towers"):
        _build(model, is_training=True)
    created = set(v1.global_variables())
    assert v1.trainable_variables()
    for is_training in (True, False):  # a second training tower, then an eval graph
        with v1.variable_scope("towers", reuse=True):
            _build(model, is_training)
        assert set(v1.global_variables()) == created


def test_models_place_no_ops(graph):
    for name in BUT_RESNET56:
        model = models.build(name, SMALL[name])
        for is_training in (True, False):
            with v1.variable_scope(f"{name}_{is_training}"):
                _build(model, is_training)
    placed = [op.name for op in graph.get_operations() if op.device]
    assert placed == []


# --- registry ---------------------------------------------------------------------------


def test_names_and_defaults():
    assert models.names() == ["convnet", "lstm_lm", "mlp", "resnet20", "resnet56"]
    assert models.default_params("mlp") == {
        "input_dim": 784,
        "hidden_units": (256, 256),
        "num_classes": 10,
        "dropout": 0.0,
    }
    lm = models.build("lstm_lm")
    assert lm.params == models.lstm_lm.Params()
    assert lm.input_spec == models.InputSpec((20,), tf.int32, (20,), tf.int32, 10000)
    assert models.build("resnet56").input_spec.feature_shape == (32, 32, 3)


def test_build_converts_lists_and_ints():
    model = models.build("mlp", {"hidden_units": [64, 32], "dropout": 0})
    assert model.params.hidden_units == (64, 32)
    assert model.params.dropout == 0.0 and isinstance(model.params.dropout, float)
    assert model.params.input_dim == 784


def _error(name, params=None) -> str:
    with pytest.raises(ValueError) as info:
        models.build(name, params)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_unknown_model_name():
    message = _error("resnet2")
    assert "'resnet2'" in message and "did you mean 'resnet20'?" in message
    assert "convnet, lstm_lm, mlp, resnet20, resnet56" in message
    assert "did you mean" not in _error("transformer")
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        models.default_params("nope")


def test_unknown_parameter():
    message = _error("mlp", {"hiden_units": [10]})
    assert "'hiden_units'" in message and "'mlp'" in message
    assert "did you mean 'hidden_units'?" in message
    assert "dropout, hidden_units, input_dim, num_classes" in message


@pytest.mark.parametrize(
    "name, params, expected",
    [
        ("mlp", {"num_classes": "10"}, "an int"),
        ("mlp", {"num_classes": 2.5}, "an int"),
        ("mlp", {"num_classes": True}, "an int"),
        ("mlp", {"dropout": "0.5"}, "a float"),
        ("mlp", {"dropout": False}, "a float"),
        ("mlp", {"hidden_units": 64}, "a list or tuple of int"),
        ("mlp", {"hidden_units": [64, "32"]}, "a list or tuple of int"),
        ("resnet20", {"weight_decay": None}, "a float"),
    ],
)
def test_wrong_type(name, params, expected):
    message = _error(name, params)
    (key, value) = next(iter(params.items()))
    assert f"'{key}'" in message and expected in message and repr(value) in message


@pytest.mark.parametrize(
    "name, params",
    [
        ("mlp", {"num_classes": 0}),
        ("mlp", {"hidden_units": [64, 0]}),
        ("lstm_lm", {"hidden_size": -1}),
        ("convnet", {"filters": (32, -64)}),
    ],
)
def test_non_positive_size(name, params):
    message = _error(name, params)
    key = next(iter(params))
    assert f"'{key}'" in message and "positive" in message


@pytest.mark.parametrize(
    "name, params",
    [("mlp", {"dropout": 1.0}), ("resnet56", {"weight_decay": -1e-4})],
)
def test_out_of_range(name, params):
    message = _error(name, params)
    assert f"'{next(iter(params))}'" in message and f"'{name}'" in message
