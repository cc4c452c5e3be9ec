"""build_train_op: N towers must train exactly like one device on the whole batch."""

import numpy as np
import pytest
import tensorflow as tf
from helpers.sessions import quick_session_config
from helpers.tower_training import (
    SMALL,
    assert_same_variables,
    check_equivalent,
    cpus,
    get_variable,
    image_batches,
    momentum,
    moving_mean_model,
    tiny_classifier,
    train,
)

import models
import towers


@pytest.mark.parametrize("num_towers", [2, 3, 4])
@pytest.mark.parametrize("model_name", ["mlp", "convnet"])
def test_towers_train_exactly_like_one_device(model_name, num_towers):
    check_equivalent(model_name, num_towers, batch_size=24)


@pytest.mark.parametrize("model_name", ["mlp", "convnet"])
def test_uneven_batch_weights_towers_by_example_count(model_name):
    check_equivalent(model_name, 4, batch_size=10)


@pytest.mark.parametrize("num_towers", [2, 4])
def test_replicated_trains_exactly_like_one_device(num_towers):
    check_equivalent("mlp", num_towers, batch_size=10, mode="replicated")


def test_replicated_matches_parameter_server_on_convnet():
    model = models.build("convnet", SMALL["convnet"])
    batches = image_batches(model.input_spec, 12, 10)
    start, ps = train(model.model_fn, cpus(3), batches)
    _, rep = train(model.model_fn, cpus(3), batches, mode="replicated", initial=start)
    assert_same_variables(ps, rep)


@pytest.mark.parametrize("opt", [
    lambda: tf.compat.v1.train.AdamOptimizer(0.01),
    lambda: tf.compat.v1.train.RMSPropOptimizer(0.01),
], ids=["adam", "rmsprop"])
def test_replicated_with_stateful_optimizers_matches_one_device(opt):
    batches = image_batches(models.InputSpec((4,), tf.float32, (), tf.int32, 3), 8, 10)
    start, single = train(tiny_classifier, ["/cpu:0"], batches, optimizer=opt)
    _, rep = train(tiny_classifier, cpus(2), batches, mode="replicated", optimizer=opt,
                   initial=start)
    assert_same_variables(single, rep)


def test_clipping_applies_to_the_combined_gradient():
    batches = image_batches(models.InputSpec((4,), tf.float32, (), tf.int32, 3), 8, 10)
    start, single = train(tiny_classifier, ["/cpu:0"], batches, clip_norm=0.01)
    _, multi = train(tiny_classifier, cpus(4), batches, clip_norm=0.01, initial=start)
    _, unclipped = train(tiny_classifier, ["/cpu:0"], batches, initial=start)
    assert_same_variables(single, multi)
    assert not np.allclose(single["w"], unclipped["w"], atol=1e-5)


def test_sparse_embedding_gradients_match_one_device():
    def embed_model(ids, labels, ctx):
        table = get_variable("table", [20, 5])
        w = get_variable("w", [5, 3])
        pooled = tf.reduce_mean(tf.nn.embedding_lookup(table, ids), axis=1)
        logits = tf.matmul(pooled, w)
        return tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        )

    rng = np.random.default_rng(1)
    batches = [(rng.integers(0, 20, (9, 6)).astype(np.int32),
                rng.integers(0, 3, 9).astype(np.int32)) for _ in range(10)]
    start, single = train(embed_model, ["/cpu:0"], batches)
    _, multi = train(embed_model, cpus(4), batches, initial=start)
    _, rep = train(embed_model, cpus(2), batches, mode="replicated", initial=start)
    assert_same_variables(single, multi)
    assert_same_variables(single, rep)


# --- batch norm, outputs, eval ------------------------------------------------------------

@pytest.mark.parametrize("mode", ["parameter_server", "replicated"])
def test_batch_norm_statistics_come_from_tower_zero(mode):
    # Tower 0 sees only ones, tower 1 only fives: the moving mean must be all ones.
    x = np.concatenate([np.ones((4, 4)), 5 * np.ones((4, 4))]).astype(np.float32)
    y = np.zeros(8, np.int32)
    graph = tf.Graph()
    with graph.as_default():
        ops = towers.build_train_op(moving_mean_model, tf.constant(x), tf.constant(y),
                                    momentum(), cpus(2), variable_update=mode)
        (moving,) = [v for v in tf.compat.v1.global_variables() if "moving_mean" in v.op.name]
        with tf.compat.v1.Session(config=quick_session_config(2)) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(ops.sync_op)
            sess.run(ops.train_op)
            np.testing.assert_array_equal(sess.run(moving), np.ones(4))


def test_loss_and_metrics_are_example_weighted_means(graph):
    def constant_per_tower(features, labels, ctx):
        w = get_variable("w", [], initializer=tf.zeros_initializer())
        value = tf.cast(ctx.index, tf.float32) + 0.0 * w
        return towers.TowerOutputs(value + w, {"index": value})

    # 10 examples over 4 towers: 3, 3, 2, 2 -> (0*3 + 1*3 + 2*2 + 3*2) / 10 = 1.3
    ops = towers.build_train_op(constant_per_tower, tf.zeros([10, 1]), tf.zeros([10], tf.int32),
                                momentum(), cpus(4))
    with tf.compat.v1.Session(config=quick_session_config(4)) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        loss, metrics, step = sess.run([ops.loss, ops.metrics, ops.global_step])
        sess.run(ops.train_op)
        assert sess.run(ops.global_step) == step + 1
    assert loss == pytest.approx(1.3)
    assert metrics["index"] == pytest.approx(1.3)


def test_eval_ops_match_one_device(graph):
    model = models.build("mlp", SMALL["mlp"])
    (x, y), = image_batches(model.input_spec, 10, 1)
    ops = towers.build_eval_ops(model.model_fn, tf.constant(x), tf.constant(y), cpus(3))
    single = towers.build_eval_ops(model.model_fn, tf.constant(x), tf.constant(y), ["/cpu:0"])
    with tf.compat.v1.Session(config=quick_session_config(3)) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        got, want = sess.run([ops, single])
    assert got.loss == pytest.approx(want.loss, abs=1e-6)
    assert got.metrics["accuracy"] == pytest.approx(want.metrics["accuracy"], abs=1e-6)


@pytest.mark.parametrize("model_name", ["mlp", "convnet"])
@pytest.mark.parametrize("batch", [1, 2, 5])
@pytest.mark.parametrize("known", [True, False], ids=["static", "dynamic"])
def test_eval_batches_smaller_than_the_towers_match_one_device(graph, model_name, batch, known):
    # An evaluation's last batch may hold fewer examples than there are towers: a tower
    # given none weighs 0 and adds nothing, not the NaN of its mean over nothing.
    tf.compat.v1.set_random_seed(0)  # the same weights every run
    model = models.build(model_name, SMALL[model_name])
    (x, y), = image_batches(model.input_spec, batch, 1)
    if known:
        features, labels, feed = tf.constant(x), tf.constant(y), {}
    else:
        features = tf.compat.v1.placeholder(tf.float32, [None, *x.shape[1:]])
        labels = tf.compat.v1.placeholder(tf.int32, [None])
        feed = {features: x, labels: y}
    ops = towers.build_eval_ops(model.model_fn, features, labels, cpus(3))
    single = towers.build_eval_ops(model.model_fn, features, labels, ["/cpu:0"])
    with tf.compat.v1.Session(config=quick_session_config(3)) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        got, want = sess.run([ops, single], feed)
    assert got.num_examples == want.num_examples == batch
    assert np.isfinite(got.loss) and got.loss == pytest.approx(want.loss, abs=1e-5)
    np.testing.assert_allclose(got.predictions, want.predictions, rtol=1e-5, atol=1e-6)
    # Accuracy against each one's own predictions: with random weights two classes can
    # tie within rounding, and N towers may then pick the other one of the two.
    for run in got, want:
        hits = np.argmax(run.predictions, axis=-1) == y
        assert run.metrics["accuracy"] == pytest.approx(hits.mean(), abs=1e-6)


def test_training_still_refuses_a_batch_that_leaves_a_tower_without_examples(graph):
    with pytest.raises(ValueError, match="cannot give each of 3 towers at least one example"):
        towers.build_train_op(tiny_classifier, tf.zeros([2, 4]), tf.zeros([2], tf.int32),
                              momentum(), cpus(3))


# --- errors a model author or caller can make ------------------------------------------------

def test_later_tower_asking_for_a_new_variable_is_named(graph):
    def sneaky(features, labels, ctx):
        w = get_variable("w", [4, 3])
        if ctx.index == 1:
            w = w + get_variable("extra_bias", [3])
        return tf.reduce_mean(tf.matmul(features, w))

    with pytest.raises(ValueError, match="tower 1 asked for variable 'extra_bias'"):
        towers.build_train_op(sneaky, tf.zeros([4, 4]), tf.zeros([4], tf.int32), momentum(),
                              cpus(2))


def test_later_tower_making_a_plain_variable_is_named(graph):
    def sneaky(features, labels, ctx):
        w = get_variable("w", [4, 3])
        if ctx.index == 1:
            w = w * tf.Variable(1.0, name="rogue_scale")
        return tf.reduce_mean(tf.matmul(features, w))

    with pytest.raises(ValueError, match="tower 1 made variable .rogue_scale. .*tower 0 made"):
        towers.build_train_op(sneaky, tf.zeros([4, 4]), tf.zeros([4], tf.int32), momentum(),
                              cpus(2))


@pytest.mark.parametrize("kwargs, message", [
    ({"devices": []}, "non-empty list"),
    ({"devices": "/cpu:0"}, "non-empty list"),
    ({"devices": ["/cpu:0", 1]}, "device strings"),
    ({"variable_update": "ring"}, "variable_update must be one of"),
    ({"clip_norm": 0.0}, "clip_norm must be positive"),
])
def test_bad_arguments_are_clear_errors(graph, kwargs, message):
    args = {"devices": cpus(2), **kwargs}
    with pytest.raises(ValueError, match=message):
        towers.build_train_op(tiny_classifier, tf.zeros([4, 4]), tf.zeros([4], tf.int32),
                              momentum(), **args)


def test_non_scalar_loss_is_rejected(graph):
    def per_example(features, labels, ctx):
        return tf.reduce_sum(tf.matmul(features, get_variable("w", [4, 3])), axis=1)

    with pytest.raises(ValueError, match="loss must be a scalar"):
        towers.build_train_op(per_example, tf.zeros([4, 4]), tf.zeros([4], tf.int32),
                              momentum(), cpus(2))


def _writes_of(handle: tf.Tensor) -> list[tf.compat.v1.Operation]:
    """The ops that can change the variable behind `handle`: those its handle reaches
    (through Switch or Identity, or as a cond's captured input) that are no read."""
    reads = {"ReadVariableOp", "VarIsInitializedOp", "Switch", "Identity", "Merge"}
    found, todo, seen = [], [handle], set()
    while todo:
        for op in todo.pop().consumers():
            if op in seen:
                continue
            seen.add(op)
            if op.type in reads:
                todo.extend(op.outputs)
            else:
                found.append(op)
    return found


def _ancestors(op: tf.compat.v1.Operation) -> set:
    seen, todo = set(), [op]
    while todo:
        current = todo.pop()
        for before in [t.op for t in current.inputs] + list(current.control_inputs):
            if before not in seen:
                seen.add(before)
                todo.append(before)
    return seen


@pytest.mark.parametrize("kwargs", [
    {"nonfinite": "apply"}, {"nonfinite": "raise"}, {"nonfinite": "skip"},
    {"nonfinite": "skip", "precision": "mixed_float16"},
    {"nonfinite": "apply", "variable_update": "replicated"},
], ids=["apply", "raise", "skip", "skip-loss-scale", "replicated"])
def test_every_increment_of_the_step_waits_for_its_read(graph, kwargs):
    """A fetched variable may be read after the step increments it (a few steps in a
    thousand): step_started is read first, so a hook numbering steps counts each once."""
    ops = towers.build_train_op(tiny_classifier, tf.ones([4, 4]), tf.zeros([4], tf.int32),
                                momentum(), cpus(2), **kwargs)
    writes = [op for op in _writes_of(ops.global_step.handle)
              if op is not ops.global_step.initializer]
    assert writes
    assert all(ops.step_started.op in _ancestors(op) for op in writes), \
        [op.name for op in writes if ops.step_started.op not in _ancestors(op)]


def test_the_step_started_counts_every_step_once(graph):
    ops = towers.build_train_op(tiny_classifier, tf.ones([4, 4]), tf.zeros([4], tf.int32),
                                momentum(), cpus(2), nonfinite="skip")
    steps = 2000
    with tf.compat.v1.Session(config=quick_session_config(2)) as sess:
        sess.run(ops.init_op)
        started = [sess.run([ops.train_op, ops.step_started])[1] for _ in range(steps)]
    assert started == list(range(steps))
