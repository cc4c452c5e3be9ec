"""A step's state updates (towers.state_updates): every form a model makes runs once per
step, in every non-finite policy and update mode, and sees the weights before the
step's update; the weight averages (moving_average_decay) are such updates too."""

import numpy as np
import pytest
import tensorflow as tf
from helpers.sessions import quick_session_config

import towers

v1 = tf.compat.v1
STEPS = 3
DECAY = 0.5
RATE = 0.5

# Every form a model's state update takes, each counting into its own variable.
FORMS = ("op", "group", "nested_group", "list", "bare_assign", "bare_group",
         "ema_in_update_ops", "bare_ema")


def counter(name):
    return v1.get_variable(name, [], trainable=False, initializer=tf.zeros_initializer())


def counting_model(features, labels, ctx):
    """A softmax regression whose model function makes a state update of every form:
    a count per form (each +1 a step it runs), and two ExponentialMovingAverages of the
    weights, one added to UPDATE_OPS as TensorFlow's CIFAR-10 tutorial does, one not."""
    # float32 in every precision, so the averages are of the variable, not of a cast.
    w = v1.get_variable("w", [4, 3], tf.float32, initializer=tf.constant_initializer(0.5))
    add = v1.add_to_collection
    ops = v1.GraphKeys.UPDATE_OPS
    counts = {form: counter(f"count_{form}") for form in FORMS[:6]}
    add(ops, counts["op"].assign_add(1.0))
    add(ops, tf.group(counts["group"].assign_add(1.0)))
    add(ops, tf.group(tf.group(counts["nested_group"].assign_add(1.0)), tf.no_op()))
    add(ops, [counts["list"].assign_add(1.0), tf.no_op()])
    counts["bare_assign"].assign_add(1.0)
    tf.group(counts["bare_group"].assign_add(1.0))
    add(ops, v1.train.ExponentialMovingAverage(DECAY, name="in_update_ops").apply([w]))
    v1.train.ExponentialMovingAverage(DECAY, name="bare").apply([w])
    logits = tf.cast(tf.matmul(features, tf.cast(w, features.dtype)), tf.float32)
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels,
                                                                         logits=logits))


def data(steps=STEPS, poisoned=()):
    """Batches of 8 examples, 4 features; a step in `poisoned` gets a NaN feature."""
    rng = np.random.default_rng(3)
    out = []
    for step in range(steps):
        x = rng.normal(size=(8, 4)).astype(np.float32)
        if step in poisoned:
            x[0, 0] = np.nan
        out.append((x, rng.integers(0, 3, 8).astype(np.int32)))
    return out


def cross_process(devices):
    # One process's stand-in for Horovod's all-reduce (the real one: tests/launch).
    return towers.resolve_variable_update("parameter_server", "/cpu:0", devices,
                                          reduce=lambda values: values)


def run(devices, batches, *, mode="parameter_server", watch=(), **options):
    """Train on `batches` step by step: the value of every variable in `watch` (names)
    before the first step and after each step, and whether a step failed."""
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float32, [8, 4])
        y = v1.placeholder(tf.int32, [8])
        if mode == "cross_process":
            mode = cross_process(devices)
        ops = towers.build_train_op(counting_model, x, y,
                                    v1.train.GradientDescentOptimizer(RATE), devices,
                                    variable_update=mode, **options)
        variables = {v.op.name: v for v in v1.global_variables()}
        with v1.Session(config=quick_session_config(2)) as sess:
            sess.run(ops.init_op)
            seen = [sess.run({n: variables[n] for n in watch})]
            for xb, yb in batches:
                try:
                    sess.run(ops.train_op, {x: xb, y: yb})
                except tf.errors.InvalidArgumentError:
                    pass
                seen.append(sess.run({n: variables[n] for n in watch}))
            return seen


COUNTS = [f"count_{form}" for form in FORMS[:6]]
TWO = ["/cpu:0", "/cpu:1"]
BUILDS = {  # (devices, build_train_op options)
    "parameter_server": (TWO, {}),
    "replicated, 2 micro-batches": (TWO, {"mode": "replicated", "accumulate_steps": 2}),
}
POLICIES = {
    "apply": {"nonfinite": "apply"},
    "raise": {"nonfinite": "raise"},
    "skip": {"nonfinite": "skip"},
    "loss scale": {"nonfinite": "skip", "precision": "mixed_float16"},
}


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("policy", POLICIES)
def test_every_form_of_state_update_runs_once_a_step(policy, build):
    devices, options = BUILDS[build]
    final = run(devices, data(), watch=COUNTS, **options, **POLICIES[policy])[-1]
    assert final == {name: STEPS for name in COUNTS}


@pytest.mark.parametrize("policy", ["raise", "skip"])
def test_a_step_that_is_not_applied_runs_no_state_update(policy):
    final = run(TWO, data(poisoned=[1]), watch=COUNTS, nonfinite=policy)[-1]
    assert final == {name: STEPS - 1 for name in COUNTS}


def expected_average(weights, first_average, decay_at):
    """What an average holding the weights before each step is after each step:
    weights[t] is the weights before step t; decay_at(t) the decay step t uses."""
    out = [first_average]
    for t in range(len(weights) - 1):
        d = decay_at(t)
        out.append(d * out[-1] + (1 - d) * weights[t])
    return out


def check_averages_saw_weights_before_each_step(seen, average, decay_at):
    weights = [s["w"] for s in seen]
    want = expected_average(weights, seen[0][average], decay_at)
    for step, (got, expected) in enumerate(zip((s[average] for s in seen), want, strict=True)):
        np.testing.assert_allclose(got, expected, atol=1e-7, rtol=0,
                                   err_msg=f"{average} after step {step}")
    assert np.abs(weights[-1] - weights[0]).max() > 1e-2  # the weights moved


MODES = {
    "one device": (["/cpu:0"], {}),
    "parameter_server": (TWO, {}),
    "replicated": (TWO, {"mode": "replicated"}),
    "cross_process": (TWO, {"mode": "cross_process"}),
    "2 micro-batches": (TWO, {"accumulate_steps": 2}),
    "replicated, skip": (TWO, {"mode": "replicated", "nonfinite": "skip"}),
    "raise": (TWO, {"nonfinite": "raise"}),
}
AVERAGES = ["w/in_update_ops", "w/bare", f"w/{towers.AVERAGE_NAME}"]


@pytest.mark.parametrize("mode", MODES)
def test_state_updates_see_the_weights_before_the_step(mode):
    # Each average after step t is decay * (its value before) + (1 - decay) * (the
    # weights before step t): the weights the step's forward pass read.
    devices, options = MODES[mode]
    seen = run(devices, data(), watch=["w", *AVERAGES], moving_average_decay=0.9,
               **options)
    for average in AVERAGES[:2]:
        check_averages_saw_weights_before_each_step(seen, average, lambda t: DECAY)
    # The job's averages: TensorFlow's num_updates rule, at the step's global step.
    check_averages_saw_weights_before_each_step(
        seen, AVERAGES[2], lambda t: min(0.9, (1 + t) / (10 + t)))


def test_weight_averages_equal_for_one_device_and_towers():
    names = ["w", f"w/{towers.AVERAGE_NAME}"]
    one = run(["/cpu:0"], data(), watch=names, moving_average_decay=0.9)[-1]
    two = run(TWO, data(), watch=names, mode="replicated", moving_average_decay=0.9)[-1]
    for name in names:
        np.testing.assert_allclose(two[name], one[name], atol=1e-6, rtol=0, err_msg=name)


def test_a_bad_decay_is_refused_in_one_line():
    with tf.Graph().as_default(), pytest.raises(ValueError, match="between 0 and 1"):
        towers.build_train_op(counting_model, tf.zeros([8, 4]), tf.zeros([8], tf.int32),
                              v1.train.GradientDescentOptimizer(RATE), TWO,
                              moving_average_decay=1.5)


def test_a_state_update_that_cannot_be_held_back_is_named():
    def model(features, labels, ctx):
        w = v1.get_variable("w", [4, 3])
        state = counter("state")
        v1.add_to_collection(v1.GraphKeys.UPDATE_OPS, tf.raw_ops.ConcatV2(
            values=[state.read_value()[None], state.read_value()[None]], axis=0).op)
        return tf.reduce_mean(tf.matmul(features, w))

    with tf.Graph().as_default(), pytest.raises(ValueError, match="ConcatV2.*assignments"):
        towers.build_train_op(model, tf.zeros([8, 4]), tf.zeros([8], tf.int32),
                              v1.train.GradientDescentOptimizer(RATE), TWO, nonfinite="skip")


def test_gradients_wait_on_one_op_for_all_the_updates():
    # A gradient made to wait on each update would cost gradients x updates control
    # edges (resnet20: 59 x 40), which graph optimisation and every step walk.
    with tf.Graph().as_default():
        counts = [counter(f"count_{i}") for i in range(5)]
        updates = [c.assign_add(1.0).op for c in counts]
        weights = [v1.get_variable(f"w{i}", [2]) for i in range(3)]
        pairs = [(tf.ones([2]) * i, w) for i, w in enumerate(weights)]
        waiting = towers.state_updates.first(updates, pairs)
        assert all(len(g.op.control_inputs) == 1 for g, _ in waiting)
        with v1.Session(config=quick_session_config()) as sess:
            sess.run(v1.global_variables_initializer())
            got = sess.run([g for g, _ in waiting])
            assert sess.run(counts) == [1.0] * 5  # each update ran, once
    np.testing.assert_array_equal(got, [[0, 0], [1, 1], [2, 2]])
