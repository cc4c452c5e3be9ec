"""Which devices a job's towers and variables get, from towers.* and the GPUs visible."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import tensorflow as tf
from helpers.sessions import without_rewriting

from launch.config import SessionConfig, from_dict
from launch.devices import (
    CPU_TOWERS_WITHOUT_GPU,
    DeviceError,
    num_cpu_devices,
    on_cpus,
    param_device,
    session_config,
    tower_devices,
    visible_physical_ids,
)


def towers(**section):
    return from_dict({"towers": section}).towers


def test_auto_is_every_gpu_or_two_cpu_devices_without_one():
    assert tower_devices(towers(devices="auto"), 3) == ["/gpu:0", "/gpu:1", "/gpu:2"]
    assert tower_devices(towers(devices="auto"), 0) == [
        f"/cpu:{i}" for i in range(CPU_TOWERS_WITHOUT_GPU)]


def test_a_count_takes_the_first_devices_of_the_host_kind():
    assert tower_devices(towers(devices=2), 4) == ["/gpu:0", "/gpu:1"]
    assert tower_devices(towers(devices=3), 0) == ["/cpu:0", "/cpu:1", "/cpu:2"]


def test_more_towers_than_gpus_is_an_error_naming_both():
    with pytest.raises(DeviceError, match="5 towers asked for, but 2 GPU"):
        tower_devices(towers(devices=5), 2)


def test_a_list_is_taken_as_given_if_each_device_exists():
    assert tower_devices(towers(devices=["/gpu:0", "/gpu:2"]), 3) == ["/gpu:0", "/gpu:2"]
    with pytest.raises(DeviceError, match="/gpu:1 does not exist.*use /cpu:i"):
        tower_devices(towers(devices=["/gpu:1"]), 0)


def test_param_device_choices():
    assert param_device(towers(param_device="cpu"), 2) == "/cpu:0"
    assert param_device(towers(param_device="gpu"), 2) == "/gpu:0"
    assert param_device(towers(param_device="least_loaded"), 2) == "least_loaded"
    with pytest.raises(DeviceError, match="no GPU is visible"):
        param_device(towers(param_device="gpu"), 0)


def test_the_session_gets_a_cpu_device_for_every_cpu_named():
    assert num_cpu_devices(["/gpu:0", "/gpu:1"], "/cpu:0") == 1
    assert num_cpu_devices(["/cpu:0", "/cpu:3"], "/cpu:0") == 4
    assert num_cpu_devices(["/cpu:0", "/cpu:1"], "least_loaded") == 2


def test_towers_on_cpus_are_told_apart_from_any_on_a_gpu():
    assert on_cpus(["/cpu:0", "/cpu:1"]) and on_cpus(["/job:worker/task:0/device:CPU:0"])
    assert not on_cpus(["/cpu:0", "/gpu:0"])


def _step_ops(config: tf.compat.v1.ConfigProto) -> collections.Counter:
    """The op types of the graphs a session runs for one training step of a small
    convolution, batch norm and ReLU under `config`."""
    with tf.Graph().as_default():
        images = tf.constant(np.random.default_rng(0).random((4, 8, 8, 3), np.float32))
        kernel = tf.compat.v1.get_variable("kernel", [3, 3, 3, 8])
        bias = tf.compat.v1.get_variable("bias", [8], initializer=tf.zeros_initializer())
        scale = tf.compat.v1.get_variable("scale", [8], initializer=tf.ones_initializer())
        conv = tf.nn.bias_add(tf.nn.conv2d(images, kernel, 1, "SAME"), bias)
        normed, *_ = tf.compat.v1.nn.fused_batch_norm(conv, scale, tf.zeros([8]))
        loss = tf.reduce_mean(tf.nn.relu(normed))
        step = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9).minimize(loss)
        metadata = tf.compat.v1.RunMetadata()
        with tf.compat.v1.Session(config=config) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(step, options=tf.compat.v1.RunOptions(output_partition_graphs=True),
                     run_metadata=metadata)
    return collections.Counter(n.op for g in metadata.partition_graphs for n in g.node)


def test_the_lighter_rewriting_of_cpu_towers_runs_the_step_tensorflows_default_runs():
    """graph_rewriting: one pass, no layout or memory optimizer on CPU towers, and the
    step's graph as TensorFlow's default rewriting makes it, fused kernels and all."""
    lighter = _step_ops(session_config(SessionConfig(), cpu_towers=True))
    assert lighter == _step_ops(session_config(SessionConfig()))
    # the rewriting changed the step
    assert lighter != _step_ops(without_rewriting(session_config(SessionConfig())))


def test_cuda_visible_devices_then_visible_devices_pick_physical_gpus(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert visible_physical_ids() is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert visible_physical_ids() == ["2", "3"]
    assert visible_physical_ids(SessionConfig(visible_devices="1")) == ["3"]
