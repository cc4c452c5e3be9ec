"""A collective job's worker on GPUs, checked without a GPU: the graph built, never run.

What a worker with two GPUs and its variables on GPU 0 would run each step: every
collective on GPU 0 with NCCL, the gradient bytes it exchanges, and how few
collectives packing leaves (resnet20's 59 trainable variables).
"""

import functools

import pytest
import tensorflow as tf
from helpers.tower_training import momentum

import models
import towers

WORKER = "/job:worker/task:1"
GPU0 = f"{WORKER}/device:GPU:0"
COLLECTIVES = {"CollectiveReduce", "CollectiveGather", "CollectiveBcastSend",
               "CollectiveBcastRecv"}


@functools.cache
def build(pack_bytes: int, gradient_dtype: str = "float32") -> tf.Graph:
    """Built once per argument list; tests only read it."""
    group = towers.CollectiveGroup(2, GPU0)
    reduce = towers.packed(towers.weighted_all_reduce(group, 0.5), pack_bytes)
    mode = towers.CrossProcess(reduce, param_device=GPU0, aggregation_device=GPU0)
    graph = tf.Graph()
    with graph.as_default():
        model = models.build("resnet20", {})
        spec = model.input_spec
        x = tf.zeros([8, *spec.feature_shape], spec.feature_dtype)
        y = tf.zeros([8, *spec.label_shape], spec.label_dtype)
        with tf.compat.v1.device(GPU0):
            step = tf.compat.v1.train.get_or_create_global_step()
        towers.build_train_op(model.model_fn, x, y, momentum(), [GPU0, f"{WORKER}/device:GPU:1"],
                              variable_update=mode, global_step=step,
                              precision=towers.Precision("float32", gradient_dtype))
        towers.broadcast_variables(group, tf.compat.v1.global_variables(), is_source=False)
    return graph


def collectives(graph: tf.Graph) -> list[tf.Operation]:
    return [op for op in graph.get_operations() if op.type in COLLECTIVES]


def gradient_bytes(graph: tf.Graph) -> int:
    reduces = [op for op in collectives(graph) if op.type == "CollectiveReduce"
               and "job_wide_outputs" not in op.name]
    return sum(op.inputs[0].shape.num_elements() * op.inputs[0].dtype.size for op in reduces)


def trainable_bytes(graph: tf.Graph) -> int:
    with graph.as_default():
        return sum(v.shape.num_elements() * 4 for v in tf.compat.v1.trainable_variables())


def test_every_collective_runs_on_the_workers_gpu_with_nccl():
    graph = build(0)
    ops = collectives(graph)
    assert ops
    for op in ops:
        assert tf.DeviceSpec.from_string(op.device) == tf.DeviceSpec.from_string(GPU0), op.name
        assert op.get_attr("communication_hint") == b"nccl", op.name
    keys = [op.get_attr("instance_key") for op in ops]
    assert len(set(keys)) == len(keys)  # each op its own instance, the same on every worker


@pytest.mark.parametrize("gradient_dtype, share", [("float32", 1), ("float16", 2)])
def test_a_step_exchanges_the_models_gradient_bytes_once(gradient_dtype, share):
    graph = build(0, gradient_dtype)
    assert gradient_bytes(graph) == trainable_bytes(graph) // share


def test_packing_leaves_one_collective_for_resnet20s_many_variables():
    unpacked, packed = build(0), build(4 * 2**20)
    count = {g: sum(op.type == "CollectiveReduce" and "job_wide_outputs" not in op.name
                    for op in collectives(g)) for g in (unpacked, packed)}
    with unpacked.as_default():
        assert count[unpacked] == len(tf.compat.v1.trainable_variables()) > 50
    assert count[packed] == 1  # 1.1 MB of float32 gradients in one 4 MiB buffer
    assert gradient_bytes(packed) == gradient_bytes(unpacked)
    print(f"resnet20: {count[unpacked]} all-reduces of {gradient_bytes(unpacked)} bytes per "
          f"step unpacked, {count[packed]} packed")
