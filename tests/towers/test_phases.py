"""towers.step_phase reads the phase of a step back from the names this package gives
the ops: each tower's forward and backward is compute, aggregation and all-reduce are
exchange, the optimizer's update is apply, the input's get-next is input."""

import pytest
import tensorflow as tf
from helpers.tower_training import momentum, tiny_classifier

import towers

DEVICES = ["/cpu:0", "/cpu:1"]


def phases_of(graph: tf.Graph) -> dict[str, str]:
    return {op.name: towers.step_phase(op.name, op.type) for op in graph.get_operations()}


def build(mode: str, **options) -> dict[str, str]:
    with tf.Graph().as_default() as graph:
        dataset = tf.data.Dataset.from_tensors(
            (tf.zeros([8, 4]), tf.zeros([8], tf.int32))).repeat()
        features, labels = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
        towers.build_train_op(tiny_classifier, features, labels, momentum(), DEVICES,
                              variable_update=mode, **options)
    return phases_of(graph)


@pytest.mark.parametrize("mode", ["parameter_server", "replicated"])
def test_every_op_of_a_tower_is_compute_and_its_update_is_apply(mode):
    phases = build(mode)
    tower_ops = [n for n in phases if n.startswith(("tower_0/", "tower_1/"))]
    assert tower_ops and all(phases[n] == "compute" for n in tower_ops
                             if "/all_reduce" not in n)
    assert phases["IteratorGetNext"] == "input"
    updates = [n for n in phases if n.startswith("Momentum/update")]
    assert updates and {phases[n] for n in updates} == {"apply"}
    assert phases["train_op"] == "apply"


def test_aggregation_and_all_reduce_are_exchange():
    phases = build("parameter_server")
    aggregation = [n for n in phases if n.startswith("aggregate")]
    assert aggregation and {phases[n] for n in aggregation} == {"exchange"}
    replicated = build("replicated")
    reduced = [n for n in replicated if "all_reduce" in n]
    assert reduced and {replicated[n] for n in reduced} == {"exchange"}


def test_later_micro_batches_are_compute_too():
    phases = build("parameter_server", accumulate_steps=2)
    micro = [n for n in phases if n.startswith("micro_batch_1/tower_")]
    assert micro and {phases[n] for n in micro} == {"compute"}


@pytest.mark.parametrize("op_type", ["_Recv", "_Send", "HorovodAllreduce", "NcclAllReduce",
                                     "AccumulatorApplyGradient", "QueueDequeueV2"])
def test_transfers_and_waits_for_peers_are_exchange_wherever_they_are(op_type):
    assert towers.step_phase("tower_0/model/dense/MatMul", op_type) == "exchange"


def test_grappler_prefixes_do_not_hide_the_tower():
    assert towers.step_phase("ConstantFolding/tower_1/gradients/x", "Const") == "compute"
