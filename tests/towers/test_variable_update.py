"""Update modes: replicated copies, mode objects, cross-process combining."""

import numpy as np
import pytest
import tensorflow as tf
from conftest import cpu_session_config
from helpers.tower_training import cpus, image_batches, momentum, tiny_classifier

import models
import towers


def test_replicated_copies_start_equal_stay_equal_and_save_once(tmp_path):
    batches = image_batches(models.InputSpec((4,), tf.float32, (), tf.int32, 3), 8, 5)
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [8, 4])
        y = tf.compat.v1.placeholder(tf.int32, [8])
        ops = towers.build_train_op(tiny_classifier, x, y, momentum(), cpus(3),
                                    variable_update="replicated")
        copies = tf.compat.v1.get_collection(towers.REPLICA_COPIES)
        assert {v.device for v in copies} == {"/cpu:1", "/cpu:2"}
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(config=cpu_session_config(3)) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(ops.sync_op)
            names = ["w", "b", "w/Momentum", "b/Momentum"]
            for _ in range(2):
                assert_copies_equal_tower_0s(sess, copies)
                for xb, yb in batches:
                    sess.run(ops.train_op, {x: xb, y: yb})
            path = saver.save(sess, str(tmp_path / "model"))
    saved = sorted(name for name, _ in tf.train.list_variables(path))
    assert saved == sorted(["global_step", *names])


def assert_copies_equal_tower_0s(sess, copies):
    """Every later tower's copy (`tower_i/<name>`) holds what tower 0's `<name>` holds."""
    values = sess.run({v.op.name: v for v in tf.compat.v1.global_variables()})
    for copy in copies:
        np.testing.assert_array_equal(sess.run(copy), values[copy.op.name.split("/", 1)[1]])


def replicated_graph(num_towers=2, optimizer=None):
    x = tf.compat.v1.placeholder(tf.float32, [8, 4])
    y = tf.compat.v1.placeholder(tf.int32, [8])
    ops = towers.build_train_op(tiny_classifier, x, y, optimizer or momentum(),
                                cpus(num_towers), variable_update="replicated")
    xb, yb = image_batches(models.InputSpec((4,), tf.float32, (), tf.int32, 3), 8, 1)[0]
    return ops, {x: xb, y: yb}


def test_replicated_standard_initializer_alone_says_what_to_run(graph):
    ops, feed = replicated_graph()
    with tf.compat.v1.Session(config=cpu_session_config(2)) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        try:
            sess.run(ops.train_op, feed)
            message = None
        except tf.errors.InvalidArgumentError as err:
            message = err.message
    assert message is not None and "TrainOps.init_op" in message
    assert "tower_1/w" not in message  # not the variable the user never made


def test_init_op_alone_starts_replicated_training_with_equal_copies(graph):
    ops, feed = replicated_graph(3)
    copies = tf.compat.v1.get_collection(towers.REPLICA_COPIES)
    with tf.compat.v1.Session(config=cpu_session_config(3)) as sess:
        sess.run(ops.init_op)
        sess.run(ops.train_op, feed)
        assert len(copies) == 8  # w, b and their momentum slots, on towers 1 and 2
        assert_copies_equal_tower_0s(sess, copies)


class RandomSlotMomentum(tf.compat.v1.train.MomentumOptimizer):
    """Momentum whose slots start at a random draw, not at zeros."""

    def _create_slots(self, var_list):
        for v in var_list:
            self._get_or_make_slot_with_initializer(
                v, tf.compat.v1.random_normal_initializer(), v.shape, v.dtype.base_dtype,
                "momentum", self._name)


def test_init_op_starts_every_copy_at_tower_0s_own_random_draw(graph):
    ops, _ = replicated_graph(3, RandomSlotMomentum(0.05, 0.9))
    copies = tf.compat.v1.get_collection(towers.REPLICA_COPIES)
    slot = next(v for v in tf.compat.v1.global_variables() if v.op.name == "w/Momentum")
    with tf.compat.v1.Session(config=cpu_session_config(3)) as sess:
        for _ in range(2):  # each run draws afresh, and every copy follows
            sess.run(ops.init_op)
            assert np.abs(sess.run(slot)).sum() > 0  # a draw, not zeros
            assert_copies_equal_tower_0s(sess, copies)


def test_init_op_initialises_parameter_server_mode_too(graph):
    x, y = tf.zeros([4, 4]), tf.zeros([4], tf.int32)
    ops = towers.build_train_op(tiny_classifier, x, y, momentum(), cpus(2))
    with tf.compat.v1.Session(config=cpu_session_config(2)) as sess:
        sess.run(ops.init_op)
        assert sess.run(tf.compat.v1.report_uninitialized_variables()).size == 0


def sgd_step(variable_update, devices, **kwargs):
    """Variables after one SGD step (rate 1) of tiny_classifier from a fixed start."""
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(0)
        xb, yb = image_batches(models.InputSpec((4,), tf.float32, (), tf.int32, 3), 8, 1)[0]
        ops = towers.build_train_op(tiny_classifier, tf.constant(xb), tf.constant(yb),
                                    tf.compat.v1.train.GradientDescentOptimizer(1.0), devices,
                                    variable_update=variable_update, **kwargs)
        with tf.compat.v1.Session(config=cpu_session_config(len(devices))) as sess:
            sess.run(ops.init_op)
            start = sess.run({v.op.name: v for v in tf.compat.v1.trainable_variables()})
            _, loss = sess.run([ops.train_op, ops.loss])
            end = sess.run({v.op.name: v for v in tf.compat.v1.trainable_variables()})
            variables = {v.op.name: v.device for v in tf.compat.v1.trainable_variables()}
    return start, end, loss, variables


def test_a_mode_object_equals_its_name():
    by_name = sgd_step("parameter_server", cpus(2), param_device="/cpu:1")
    by_object = sgd_step(towers.ParameterServer("/cpu:1"), cpus(2))
    for name in by_name[1]:
        np.testing.assert_array_equal(by_object[1][name], by_name[1][name])
    assert set(by_object[3].values()) == {"/cpu:1"}


def test_cross_process_combines_gradients_loss_and_metrics():
    """A stand-in for other processes: each value arrives doubled, as if a second
    process had the same gradient. The update doubles, so does the loss."""
    start, plain, loss, _ = sgd_step("parameter_server", cpus(2))
    doubled = towers.CrossProcess(lambda values: [None if v is None else 2 * v for v in values])
    _, both, both_loss, _ = sgd_step(doubled, cpus(2))
    np.testing.assert_allclose(both_loss, 2 * loss, rtol=1e-6)
    for name in start:
        np.testing.assert_allclose(start[name] - both[name], 2 * (start[name] - plain[name]),
                                   rtol=1e-5, atol=1e-7)


def test_least_loaded_is_given_as_a_device_function():
    with pytest.raises(ValueError, match="towers.least_loaded"):
        towers.ParameterServer("least_loaded")


def same_values(values):
    return values


def test_a_mode_is_made_from_its_two_choices_in_one_place():
    """How a process's towers share, and whether other processes take part."""
    alone = towers.resolve_variable_update("parameter_server", "/cpu:1", cpus(2),
                                           aggregation_device="/cpu:0")
    assert type(alone) is towers.ParameterServer
    assert (alone.param_device, alone.aggregation_device) == ("/cpu:1", "/cpu:0")
    rank = towers.resolve_variable_update("parameter_server", "/cpu:1", cpus(2),
                                          aggregation_device="/cpu:0", reduce=same_values)
    assert type(rank) is towers.CrossProcess and rank.reduce is same_values
    assert (rank.within.param_device, rank.within.aggregation_device) == ("/cpu:1", "/cpu:0")
    assert type(towers.resolve_variable_update("replicated", "/cpu:0", cpus(2))) is (
        towers.Replicated)
    with pytest.raises(ValueError, match="replicated towers are not combined across"):
        towers.resolve_variable_update("replicated", "/cpu:0", cpus(2), reduce=same_values)


def test_the_global_step_lives_beside_one_copy_of_the_variables_or_on_the_host_cpu():
    devices = ["/gpu:0", "/gpu:1"]
    setter = tf.compat.v1.train.replica_device_setter(ps_tasks=1)
    spread = towers.resolve_variable_update("parameter_server", "least_loaded", devices)
    assert towers.ParameterServer("/gpu:1").step_device(devices) == "/gpu:1"
    assert towers.ParameterServer(setter).step_device(devices) is setter
    assert towers.CrossProcess(same_values, "/cpu:0").step_device(devices) == "/cpu:0"
    for mode in (spread, towers.Replicated()):
        assert mode.step_device(devices) == "/device:CPU:0"


def test_a_least_loaded_global_step_stays_out_of_the_balance(graph):
    """Made on the host CPU, it leaves the variables where least_loaded alone puts them."""
    x, y = tf.zeros([4, 4]), tf.zeros([4], tf.int32)
    ops = towers.build_train_op(tiny_classifier, x, y, momentum(), ["/cpu:1", "/cpu:2"],
                                param_device="least_loaded")
    assert ops.global_step.device == "/device:CPU:0"
    placed = {v.op.name: v.device for v in tf.compat.v1.trainable_variables()}
    assert placed["w"] == "/cpu:1"  # the first, and largest, on the first device
