"""Shared test set-up: graph mode and sessions with N CPU devices."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.compat.v1.disable_eager_execution()


def cpu_session_config(num_cpus: int) -> tf.compat.v1.ConfigProto:
    """A session config exposing /cpu:0 .. /cpu:num_cpus-1, each a device a tower can use."""
    return tf.compat.v1.ConfigProto(
        device_count={"CPU": num_cpus},
        inter_op_parallelism_threads=2,
        intra_op_parallelism_threads=1,
    )


@pytest.fixture
def graph():
    """A fresh default graph per test, so variable names never collide."""
    g = tf.Graph()
    with g.as_default():
        yield g
