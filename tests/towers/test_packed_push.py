"""Packed gradients on their way from the device that sums them to variables on other
devices (a ps/worker worker's push to its ps tasks): the update of the unpacked push,
with one tensor per destination crossing instead of one per variable."""

import pytest
import tensorflow as tf
from helpers.tower_training import (
    SMALL,
    assert_same_variables,
    canonical,
    check_equivalent,
    image_batches,
    momentum,
    train,
)

import models
import towers

WORKER = "/job:worker/task:0"


def spread_over_two(pack_bytes):
    """Variables spread over /cpu:2 and /cpu:3 by byte size, summed on /cpu:0."""
    return towers.ParameterServer(towers.least_loaded(["/cpu:2", "/cpu:3"]),
                                  aggregation_device="/cpu:0", pack_bytes=pack_bytes)


@pytest.mark.parametrize("pack_bytes", [64, 2**20])
def test_a_packed_push_trains_like_one_device(pack_bytes):
    # 64 bytes: most buffers hold one or two small tensors and big ones travel alone.
    check_equivalent("mlp", 2, batch_size=12, mode=spread_over_two(pack_bytes))


def test_a_packed_push_in_16_bits_gives_the_unpacked_push():
    """float16 on the wire: packing changes the layout, not a single value sent."""
    model = models.build("convnet", SMALL["convnet"])
    batches = image_batches(model.input_spec, 8, 3)
    precision = towers.Precision("float32", gradient_dtype="float16")
    start, unpacked = train(model.model_fn, ["/cpu:0", "/cpu:1"], batches,
                            mode=spread_over_two(0), precision=precision)
    _, packed = train(model.model_fn, ["/cpu:0", "/cpu:1"], batches, initial=start,
                      mode=spread_over_two(4096), precision=precision)
    assert_same_variables(unpacked, packed, atol=0)


def ps_worker_graph(pack_bytes):
    """A worker with two GPUs of a job with 2 ps tasks, built and never run: (graph,
    the variables)."""
    cluster = tf.train.ClusterSpec({"ps": ["ps0:2222", "ps1:2222"],
                                    "worker": ["worker0:2222"]})
    setter = tf.compat.v1.train.replica_device_setter(
        cluster=cluster, worker_device=WORKER, ps_strategy=towers.GreedyByteBalancer(2))
    mode = towers.ParameterServer(setter, aggregation_device=f"{WORKER}/cpu:0",
                                  pack_bytes=pack_bytes)
    graph = tf.Graph()
    with graph.as_default():
        model = models.build("convnet", SMALL["convnet"])
        spec = model.input_spec
        x = tf.zeros([8, *spec.feature_shape], spec.feature_dtype)
        y = tf.zeros([8, *spec.label_shape], spec.label_dtype)
        with tf.compat.v1.device(setter):
            step = tf.compat.v1.train.get_or_create_global_step()
        gpus = [f"{WORKER}/gpu:{i}" for i in (0, 1)]
        towers.build_train_op(model.model_fn, x, y, momentum(), gpus, variable_update=mode,
                              global_step=step)
        return graph, tf.compat.v1.trainable_variables()


def task(device):
    return tf.DeviceSpec.from_string(device).replace(device_type=None, device_index=None)


def gradients_crossing(graph):
    """The gradient tensors the ps tasks' updates read from the worker: each update's
    gradient, or, packed, the buffer its gradient was split from."""
    crossing = set()
    for op in graph.get_operations():
        if op.type != "ResourceApplyMomentum":
            continue
        grad = op.inputs[3]
        while task(grad.op.device) == task(op.device) and grad.op.inputs:
            grad = grad.op.inputs[0]  # back through the reshape and split on the ps task
        if task(grad.op.device) != task(op.device):
            crossing.add(grad.name)
    return crossing


def test_a_packed_push_sends_one_buffer_per_ps_task_and_splits_it_there():
    graph, variables = ps_worker_graph(pack_bytes=4 * 2**20)
    ps_tasks = {task(v.device) for v in variables}
    assert len(ps_tasks) == 2
    buffers = gradients_crossing(graph)
    assert len(buffers) == 2
    packs = [graph.get_tensor_by_name(name).op for name in buffers]
    assert all(op.type == "ConcatV2" for op in packs)
    assert {canonical(op.device) for op in packs} == {canonical(f"{WORKER}/cpu:0")}
    splits = [op for op in graph.get_operations()
              if op.type == "SplitV" and op.name.startswith("unpack")]
    assert len(splits) == 2
    assert {task(op.device) for op in splits} == ps_tasks


def test_an_unpacked_push_sends_each_gradient_on_its_own():
    graph, variables = ps_worker_graph(pack_bytes=0)
    assert len(gradients_crossing(graph)) == len(variables)
