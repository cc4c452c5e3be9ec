"""The equivalence matrix: build_train_op against one device on the whole batch.

Each cell trains a tiny model (6 inputs, a 5-unit hidden layer, batch norm, tanh,
3 classes, an average of its weights) for 3 steps on N towers and on one device from
the same start, and compares every variable (each replicated copy too) and each step's
loss: float32 to 1e-5, bfloat16 to 5e-3 plus 5e-3 of the value (TOLERANCE). Both runs
must have moved their variables, the batch-norm moving statistics and the averages
included, or agreement would prove nothing.

The cells are generated from FACTORS, each factor's first value its base, by one rule:
  the base case: every feature on at once (replicated, 2 micro-batches, 2 towers on an
  uneven batch, get_variable regularizers, synchronized batch norm), so that what
  goes wrong only when they meet shows there; and
  a pairwise cover of the factors: for any two factors, every pair of their values is
  in some cell (so every value of each is too). It is built greedily and
  deterministically: a cell starts from the first pair still uncovered, and each
  other factor takes the value that covers most pairs still uncovered.

Per-tower batch statistics are what batch norm means without synchronization, so the
one-device reference normalizes the same groups of examples separately (the towers'
shards, or with synchronized statistics and micro-batches, the micro-batches): the
documented meaning, compared like the rest. What cannot equal one device by design
is refused with one line (REFUSED), or is listed with why in docs/library.md ("As a
library") (dropout's masks, drawn per tower).
"""

import itertools
import zlib

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import cpu_session_config

import towers

v1 = tf.compat.v1

FACTORS = {
    "mode": ["replicated", "parameter_server", "cross_process", "ps_worker"],
    "accumulate_steps": [2, 1, 3],
    "towers": ["2 uneven", "1", "2", "3", "3 uneven"],
    "regularization": ["get_variable", "none", "losses_collection", "keras", "in_loss"],
    "batch_norm": ["moments_sync", "none", "moments_local", "keras_sync", "keras_local"],
    "optimizer": ["momentum", "adam", "momentum_schedule"],
    "clip_norm": [None, 0.5],
    "precision": ["float32", "mixed_bfloat16"],
    "nonfinite": ["apply", "raise", "skip"],
}
# The forms of a state update besides batch norm's (towers.state_updates) a cell's model
# has, each an average of the weights: an ExponentialMovingAverage in UPDATE_OPS
# (TensorFlow's CIFAR-10 tutorial), the weight averages of build_train_op, one in
# nested groups in UPDATE_OPS, one in no collection. Each cell of the cover takes one
# (with_state_updates), so the cells of FACTORS stay as they were, and each form meets
# nearly every value of the other factors.
STATE_UPDATES = ["ema_collection", "averages", "nested_groups", "bare_ema"]
# 18 splits evenly at every k and N here, 19 unevenly at most. Each tower gets at least
# 2 examples: the batch norm of 1 example is its offset whatever it is, and the float
# noise of its (zero) gradient, times 1/sqrt(epsilon), is all that is left to compare.
BATCH = {"even": 18, "uneven": 19}
STEPS = 3
# |towers - one device| <= atol + rtol * |one device|, per element.
TOLERANCE = {
    "float32": (1e-5, 0.0),
    # bfloat16 keeps 8 bits of mantissa: a tower sums its shard's gradient in bfloat16,
    # one device the whole batch's, and the sums round differently. Measured here: up to
    # 3.2e-3 on a momentum slot of 0.12, 0.14% of a moving variance of 6.3 (oneDNN's
    # bfloat16 kernels, and without them), so 5e-3 and 5e-3 of the value (about 2^-8).
    "mixed_bfloat16": (5e-3, 5e-3),
}
MOVED = 2e-2  # what each of the model's variables must have moved by, at least
WEIGHT_DECAY = 0.05
MOMENTUM = 0.5  # of the batch-norm moving statistics: large steps, easy to see
EPSILON = 1e-3
AVERAGE_DECAY = 0.5  # of the weight averages: large steps, easy to see


def cells() -> list[dict]:
    base = {name: values[0] for name, values in FACTORS.items()}
    unique = {cell_id(cell): cell for cell in [base, *pairwise_cover()]}
    return with_state_updates(list(unique.values()))


def with_state_updates(made: list[dict]) -> list[dict]:
    """Each cell with the STATE_UPDATES value met least with its values of the other
    factors so far (ties go to the first)."""
    unmet = {(name, value, kind) for name, values in FACTORS.items() for value in values
             for kind in STATE_UPDATES}
    out = []
    for cell in made:
        kind = max(STATE_UPDATES, key=lambda k, c=cell: sum((n, c[n], k) in unmet
                                                             for n in FACTORS))
        unmet -= {(name, cell[name], kind) for name in FACTORS}
        out.append({**cell, "state_updates": kind})
    return out


def pairwise_cover() -> list[dict]:
    """Cells in which every pair of values of two factors appears at least once."""
    def pairs(cell):
        return {((a, cell[a]), (b, cell[b])) for a, b in itertools.combinations(FACTORS, 2)
                if a in cell and b in cell}

    uncovered = {((a, va), (b, vb)) for a, b in itertools.combinations(FACTORS, 2)
                 for va in FACTORS[a] for vb in FACTORS[b]}
    order = {(name, value): i for name, values in FACTORS.items()
             for i, value in enumerate(values)}
    found = []
    while uncovered:
        (a, va), (b, vb) = min(uncovered, key=lambda p: (order[p[0]], order[p[1]], p[0][0],
                                                         p[1][0]))
        cell = {a: va, b: vb}
        for name, values in FACTORS.items():
            if name not in cell:  # ties go to the first value: the base, or the cheaper
                cell[name] = max(values, key=lambda v, n=name: len(pairs({**cell, n: v})
                                                                   & uncovered))
        found.append(cell)
        uncovered -= pairs(cell)
    return found


def cell_id(cell: dict) -> str:
    clip = "clip" if cell["clip_norm"] else "noclip"
    return (f"{cell['mode']}-k{cell['accumulate_steps']}-{cell['towers'].replace(' ', '')}-"
            f"{cell['regularization']}-{cell['batch_norm']}-{cell['optimizer']}-{clip}-"
            f"{cell['precision']}-{cell['nonfinite']}-{cell.get('state_updates', '')}")


# --- the model -----------------------------------------------------------------------------

def penalty(weights):
    return WEIGHT_DECAY * tf.nn.l2_loss(tf.cast(weights, tf.float32))


def make_model(cell: dict, groups: list[int] | None = None):
    """The model function of `cell`. groups: on the one-device reference, the sizes of
    the consecutive groups of examples the towers normalize separately; None: as built."""
    regularization, batch_norm = cell["regularization"], cell["batch_norm"]

    def model_fn(x, y, ctx):
        penalties = []
        h = dense(x, 5, "dense1", regularization, penalties)
        h = normalize(h, batch_norm, ctx, groups)
        logits = dense(tf.tanh(h), 3, "dense2", regularization, penalties)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=y, logits=tf.cast(logits, tf.float32)))
        average_weights(cell["state_updates"])
        if regularization == "losses_collection":  # as TensorFlow's CIFAR-10 tutorial
            v1.add_to_collection("losses", loss)
            return tf.add_n(v1.get_collection("losses"))
        if regularization == "get_variable":
            return loss + v1.losses.get_regularization_loss()
        return loss + tf.add_n([tf.cast(p, tf.float32) for p in penalties]) if penalties else loss

    return model_fn


def average_weights(kind):
    """An ExponentialMovingAverage of the trainable variables made in the model function,
    as the state update `kind` says (the float32 variables, also under mixed precision:
    what tf.compat.v1.trainable_variables() holds)."""
    if kind in ("none", "averages"):  # "averages": build_train_op's own
        return
    update = v1.train.ExponentialMovingAverage(AVERAGE_DECAY).apply(v1.trainable_variables())
    if kind == "ema_collection":
        v1.add_to_collection(v1.GraphKeys.UPDATE_OPS, update)
    elif kind == "nested_groups":
        v1.add_to_collection(v1.GraphKeys.UPDATE_OPS, tf.group(tf.group(update), tf.no_op()))


def start_value(name, shape):
    """The same start in every graph (no loading): each kernel's own seeded values."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    return (rng.normal(size=shape) / np.sqrt(shape[0])).astype(np.float32)


def dense(x, units, name, regularization, penalties):
    shape = [x.shape[-1], units]
    if regularization == "keras":
        layer = keras.layers.Dense(
            units, use_bias=False, name=name,
            kernel_initializer=lambda shape, dtype=None: start_value(name, shape),
            kernel_regularizer=keras.regularizers.L2(WEIGHT_DECAY))
        out = layer(x)
        penalties.extend(layer.losses)
        return out
    regularizer = penalty if regularization == "get_variable" else None
    w = v1.get_variable(f"{name}/kernel", shape, regularizer=regularizer,
                        initializer=tf.constant_initializer(start_value(name, shape)))
    if regularization == "losses_collection":
        v1.add_to_collection("losses", penalty(w))
    elif regularization == "in_loss":
        penalties.append(penalty(w))
    return tf.matmul(x, w)


def normalize(h, kind, ctx, groups):
    if kind == "none":
        return h
    parts = tf.split(h, groups) if groups else [h]
    if kind.startswith("keras"):
        layer = keras.layers.BatchNormalization(momentum=MOMENTUM, epsilon=EPSILON, name="bn",
                                                synchronized=kind == "keras_sync")
        # The reference's first group through the layer (its moving statistics update
        # as tower 0's do), the others as the layer normalizes them.
        return tf.concat([layer(parts[0], training=True),
                          *[by_hand(p, layer.gamma, layer.beta) for p in parts[1:]]], 0)
    f32 = tf.float32
    gamma = v1.get_variable("bn/gamma", [5], f32, initializer=v1.ones_initializer())
    beta = v1.get_variable("bn/beta", [5], f32, initializer=v1.zeros_initializer())
    moving = v1.get_variable("bn/moving_mean", [5], f32, initializer=v1.zeros_initializer(),
                             trainable=False)
    outputs = []
    for i, part in enumerate(parts):
        mean, variance, _ = ctx.batch_moments(part, [0])  # the shard's, or the global batch's
        outputs.append(tf.cast(tf.nn.batch_normalization(
            tf.cast(part, f32), mean, variance, beta, gamma, EPSILON), part.dtype))
        if i == 0:
            v1.add_to_collection(v1.GraphKeys.UPDATE_OPS, moving.assign_sub(
                (moving - mean) * (1.0 - MOMENTUM), read_value=False))
    return tf.concat(outputs, 0)


def by_hand(x, gamma, beta):
    mean, variance = tf.nn.moments(tf.cast(x, tf.float32), [0])
    return tf.cast(tf.nn.batch_normalization(tf.cast(x, tf.float32), mean, variance, beta,
                                             gamma, EPSILON), x.dtype)


# --- one run -------------------------------------------------------------------------------

def num_towers(cell):
    return int(cell["towers"].split()[0])


def batch_size(cell):
    return BATCH["uneven" if "uneven" in cell["towers"] else "even"]


def shard_groups(cell) -> list[int] | None:
    """The groups of examples normalized apart when `cell` runs on its towers."""
    k, n = cell["accumulate_steps"], num_towers(cell)
    micro = towers.shard_sizes(batch_size(cell), k)
    if cell["batch_norm"] == "none":
        return None
    if cell["batch_norm"] in ("moments_sync", "keras_sync"):
        return micro
    return [size for m in micro for size in towers.shard_sizes(m, n)]


def optimizer(name, global_step):
    if name == "adam":
        return v1.train.AdamOptimizer(0.05)
    rate = 0.2
    if name == "momentum_schedule":
        rate = v1.train.exponential_decay(0.4, global_step, decay_steps=1, decay_rate=0.5)
    return v1.train.MomentumOptimizer(rate, 0.9)


def variable_update(mode, devices):
    if mode == "cross_process":
        # One process's stand-in for Horovod's all-reduce (the real one: tests/launch),
        # made as the launcher makes it: packed, with synchronized batch norm's sum.
        same = lambda values: values  # noqa: E731
        return towers.resolve_variable_update("parameter_server", "/cpu:0", devices,
                                              reduce=same, sum_across_processes=tf.identity,
                                              pack_bytes=64)
    if mode == "ps_worker":
        # As a ps/worker job's worker: summed on its own device, pushed packed to the ps.
        return towers.ParameterServer("/cpu:3", aggregation_device="/cpu:0", pack_bytes=64)
    return mode


def batches(cell):
    rng = np.random.default_rng(7)
    size = batch_size(cell)
    # An offset mean: a shard's statistics differ visibly from the batch's.
    return [((rng.normal(size=(size, 6)) * 2.0 + 1.0).astype(np.float32),
             rng.integers(0, 3, size=size).astype(np.int32)) for _ in range(STEPS)]


def session_config():
    """Four CPU devices; no graph rewriting, which costs more than these steps do."""
    config = cpu_session_config(4)
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    return config


def train(cell, devices, groups=None, **options):
    """STEPS steps of `cell` on `devices` from the model's fixed start: (first values,
    final values, losses, copies) with every saved variable by name; copies: each
    replicated copy's final value."""
    data = batches(cell)
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float32, data[0][0].shape)
        y = v1.placeholder(tf.int32, data[0][1].shape)
        global_step = v1.train.get_or_create_global_step()
        averages = AVERAGE_DECAY if cell["state_updates"] == "averages" else None
        ops = towers.build_train_op(
            make_model(cell, groups), x, y, optimizer(cell["optimizer"], global_step),
            devices, clip_norm=cell["clip_norm"], precision=cell["precision"],
            moving_average_decay=averages, **options)
        saved = {v.op.name: v for v in v1.global_variables()}
        copies = {v.op.name: v for v in v1.get_collection(towers.REPLICA_COPIES)}
        with v1.Session(config=session_config()) as sess:
            sess.run(ops.init_op)
            first = sess.run(saved)
            losses = [sess.run([ops.train_op, ops.loss], {x: xb, y: yb})[1] for xb, yb in data]
            return first, sess.run(saved), losses, sess.run(copies)


_REFERENCES: dict = {}


def reference(cell):
    """One device on the whole batch (cached: many cells share one)."""
    groups = shard_groups(cell)
    key = (cell["regularization"], cell["batch_norm"], cell["optimizer"], cell["clip_norm"],
           cell["precision"], cell["state_updates"], batch_size(cell), tuple(groups or ()))
    if key not in _REFERENCES:
        _REFERENCES[key] = train(cell, ["/cpu:0"], groups)
    return _REFERENCES[key]


SLOTS = ("/Momentum", "/Adam", "/Adam_1")
AVERAGES = ("/ExponentialMovingAverage", f"/{towers.AVERAGE_NAME}")


def moved_at_least(name):
    """An average moves by a part of what its weight moves (bn/gamma's by 6.5e-3 in the
    cell that moves it least here): 400 times the float32 tolerance."""
    return MOVED / 5 if name.endswith(AVERAGES) else MOVED


def test_the_cells_hold_every_pair_of_values_of_any_two_factors():
    made = cells()
    for a, b in itertools.combinations(FACTORS, 2):
        held = {(cell[a], cell[b]) for cell in made}
        assert held == set(itertools.product(FACTORS[a], FACTORS[b])), (a, b)


@pytest.mark.parametrize("cell", cells(), ids=cell_id)
def test_towers_equal_one_device(cell):
    start, want, want_losses, _ = reference(cell)
    devices = [f"/cpu:{i}" for i in range(num_towers(cell))]
    batch_norm = "sync" if cell["batch_norm"] == "moments_sync" else "local"
    first, got, losses, copies = train(
        cell, devices, variable_update=variable_update(cell["mode"], devices),
        accumulate_steps=cell["accumulate_steps"], nonfinite=cell["nonfinite"],
        batch_norm=batch_norm)
    atol, rtol = TOLERANCE[cell["precision"]]
    assert sorted(got) == sorted(want)
    for name in start:
        np.testing.assert_array_equal(first[name], start[name], err_msg=f"{name} at the start")
    beyond = {name: float(np.max(np.abs(got[name] - want[name]) - rtol * np.abs(want[name])))
              for name in want}
    assert max(beyond.values()) <= atol, f"differences beyond rtol * |value|: {beyond}"
    np.testing.assert_allclose(losses, want_losses, atol=atol, rtol=rtol)
    for name, value in copies.items():  # tower_i/<name>: every copy took the same steps
        np.testing.assert_allclose(value, got[name.split("/", 1)[1]], atol=atol, rtol=rtol,
                                   err_msg=name)
    # The model's variables, moving statistics included, must have moved, or agreement
    # would prove nothing (a moving mean no step updates is 0 on both sides).
    model = [name for name in want if "/" in name and not name.endswith(SLOTS)]
    unmoved = [name for name in model
               if np.abs(want[name] - start[name]).max() < moved_at_least(name)]
    assert not unmoved, f"the runs did not change {unmoved}, so agreement proves nothing"


# --- what cannot equal one device is refused ----------------------------------------------

def keras_model_made_once(built):
    """A model function calling one Keras layer made outside it (`built`: its weights
    made too, before build_train_op)."""
    layer = keras.layers.Dense(3, name="made_once")
    if built:
        layer.build((None, 6))

    def model_fn(x, y, ctx):
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=y, logits=tf.cast(layer(x), tf.float32)))

    return model_fn


REFUSED = {
    # Every tower calls the one layer, so there is no copy to give each tower.
    "made once, replicated": (False, {"variable_update": "replicated"},
                              "cannot have per-tower copies"),
    # Keras fixed its policy (float32) when it was made; the towers compute in bfloat16.
    "made once, mixed_bfloat16": (False, {"precision": "mixed_bfloat16"},
                                  "computes on made_once/kernel in float32"),
    # Its weights exist before the towers: nothing the towers make, nothing they train.
    "built before build_train_op": (True, {}, "reads trainable variable made_once/kernel, "
                                              "made before build_train_op"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_what_cannot_equal_one_device_is_refused_in_one_line(case):
    built, options, message = REFUSED[case]
    with tf.Graph().as_default():
        model_fn = keras_model_made_once(built)
        with pytest.raises(ValueError, match=message) as refused:
            towers.build_train_op(model_fn, tf.zeros([4, 6]), tf.zeros([4], tf.int32),
                                  v1.train.GradientDescentOptimizer(0.1), ["/cpu:0", "/cpu:1"],
                                  **options)
    assert "\n" not in str(refused.value)


def test_a_keras_layer_made_outside_trains_as_one_device_in_parameter_server_mode():
    # Made once and called by every tower, it is one set of weights: shared, as one
    # device's (the same start in both runs: made by one seed).
    def run(devices):
        keras.utils.set_random_seed(0)
        cell = {**{name: values[0] for name, values in FACTORS.items()}, "towers": "2"}
        x, y = batches(cell)[0]
        with tf.Graph().as_default():
            ops = towers.build_train_op(keras_model_made_once(False), tf.constant(x),
                                        tf.constant(y), v1.train.GradientDescentOptimizer(0.5),
                                        devices)
            with v1.Session(config=session_config()) as sess:
                sess.run(ops.init_op)
                start = sess.run(v1.trainable_variables())
                for _ in range(STEPS):
                    sess.run(ops.train_op)
                return start, sess.run(v1.trainable_variables())

    (start, want), (first, got) = run(["/cpu:0"]), run(["/cpu:0", "/cpu:1"])
    np.testing.assert_array_equal(first[0], start[0])
    np.testing.assert_allclose(got[0], want[0], atol=TOLERANCE["float32"][0], rtol=0)
    assert np.abs(want[0] - start[0]).max() > MOVED
