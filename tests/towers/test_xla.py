"""towers.build_train_op(xla=True): each tower compiled by XLA, the same step."""

import tensorflow as tf
from conftest import cpu_session_config
from helpers.tower_training import (
    SMALL,
    assert_same_variables,
    cpus,
    image_batches,
    momentum,
    train,
)

import models
import towers


def test_an_xla_step_equals_the_plain_step():
    # XLA compiles the towers only; what a mode does between them is plain TensorFlow.
    model = models.build("mlp", SMALL["mlp"])
    batches = image_batches(model.input_spec, 12, 3)
    start, plain = train(model.model_fn, cpus(2), batches, mode="replicated")
    _, compiled = train(model.model_fn, cpus(2), batches, mode="replicated", initial=start,
                        xla=True)
    assert_same_variables(plain, compiled)


def test_the_towers_forward_and_backward_run_as_xla_clusters(graph):
    model = models.build("mlp", SMALL["mlp"])
    (x, y), = image_batches(model.input_spec, 8, 1)
    ops = towers.build_train_op(model.model_fn, tf.constant(x), tf.constant(y), momentum(),
                                cpus(2), xla=True)
    marked = [op for op in graph.get_operations()
              if op.type == "MatMul" and op.get_attr("_XlaCompile")]
    assert {op.name.split("/")[0] for op in marked} == {"tower_0", "tower_1"}
    assert any("/gradients/" in op.name for op in marked)  # the backward pass too
    with tf.compat.v1.Session(config=cpu_session_config(2)) as sess:
        sess.run(ops.init_op)
        metadata = tf.compat.v1.RunMetadata()
        sess.run(ops.train_op, options=tf.compat.v1.RunOptions(trace_level=3),
                 run_metadata=metadata)
    ran = {n.node_name for d in metadata.step_stats.dev_stats for n in d.node_stats}
    assert any(name.endswith("/xla_run") for name in ran), sorted(ran)[:20]
