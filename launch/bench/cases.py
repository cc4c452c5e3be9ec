"""In-process rows built on the towers: one Session running `towers.build_train_op`.

Also what every in-process row shares: the synthetic batch, the optimizer, and
BuiltCase, the handle the case process drives (the mirrored row's builder,
in `launch.bench.mirrored`, returns one too).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple

from launch.bench.limits import step_flops
from launch.bench.settings import FLOAT32, Variant


def synthetic_batch(spec, batch: int, seed: int = 0):
    """Numpy features [batch, *feature_shape] and labels [batch, *label_shape] for a model."""
    import numpy as np

    rng = np.random.default_rng(seed)
    if spec.feature_dtype.is_integer:
        x = rng.integers(0, spec.num_classes, (batch, *spec.feature_shape))
    else:
        x = rng.normal(size=(batch, *spec.feature_shape))
    y = rng.integers(0, spec.num_classes, (batch, *spec.label_shape))
    return x.astype(spec.feature_dtype.as_numpy_dtype), y.astype(spec.label_dtype.as_numpy_dtype)


def optimizer():
    """The one optimizer every row uses (momentum 0.9, learning rate 0.01)."""
    import tensorflow as tf

    return tf.compat.v1.train.MomentumOptimizer(0.01, 0.9)


def bytes_of(variables: Iterable) -> int:
    """Total bytes of the variables' values."""
    return sum(v.shape.num_elements() * v.dtype.size for v in variables)


class BuiltCase(NamedTuple):
    """One in-process row, built. run(steps) trains; facts: variable counts and bytes;
    read() and write(values): the trainable variables as {name: numpy array}."""

    run: Callable[[int], None]
    facts: dict
    read: Callable[[], dict]
    write: Callable[[dict], None]


def build_towers_case(model, batch: int, mode: str, num_towers: int,
                      variant: Variant = FLOAT32) -> BuiltCase:
    """A session running `towers.build_train_op` on /cpu:0../cpu:N-1 with the batch held
    in the graph (no input pipeline cost, as tf_cnn_benchmarks does), computing as
    `variant` says, in a process in graph mode (launch.log.use_graph_mode).
    facts["step_flops"]: the profiler's count for one step; facts["kernels"]: its
    convolutions and matrix products (launch.kernels), each with its runs per step."""
    import tensorflow as tf

    import towers
    from launch.kernels import kernels_of, ops_run_by

    x, y = synthetic_batch(model.input_spec, batch)
    graph = tf.Graph()
    with graph.as_default():
        precision = towers.Precision(variant.precision, variant.gradient_dtype)
        ops = towers.build_train_op(
            model.model_fn, tf.constant(x), tf.constant(y), optimizer(),
            [f"/cpu:{i}" for i in range(num_towers)], variable_update=mode,
            precision=precision, accumulate_steps=variant.accumulate, xla=variant.xla,
            batch_norm=variant.batch_norm,
        )
        trainable = {v.op.name: v for v in tf.compat.v1.trainable_variables()}
        placeholders = {name: tf.compat.v1.placeholder(v.dtype.base_dtype, v.shape)
                        for name, v in trainable.items()}
        load = tf.group(*[v.assign(placeholders[name]) for name, v in trainable.items()])
        facts = {
            "trainable_bytes": bytes_of(tf.compat.v1.trainable_variables()),
            "variable_bytes": bytes_of(tf.compat.v1.global_variables()),
            "variables": len(tf.compat.v1.global_variables()),
            "step_flops": step_flops(graph, ops.train_op),
            "kernels": kernels_of(ops_run_by(ops.train_op)),
        }
        graph.finalize()
    config = tf.compat.v1.ConfigProto(device_count={"CPU": num_towers})
    session = tf.compat.v1.Session(graph=graph, config=config)
    session.run(ops.init_op)

    def run(steps: int) -> None:
        for _ in range(steps):
            session.run(ops.train_op)

    def write(values: dict) -> None:
        session.run(load, {placeholders[name]: value for name, value in values.items()})
        session.run(ops.sync_op)

    return BuiltCase(run, facts, lambda: session.run(trainable), write)
