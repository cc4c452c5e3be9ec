"""Shared test set-up: graph mode, sessions with N CPU devices, the e2e tier kept honest."""

import os
import subprocess

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from helpers import net_hosts  # noqa: E402

tf.compat.v1.disable_eager_execution()


def cpu_session_config(num_cpus: int) -> tf.compat.v1.ConfigProto:
    """A session config exposing /cpu:0 .. /cpu:num_cpus-1, each a device a tower can use."""
    return tf.compat.v1.ConfigProto(
        device_count={"CPU": num_cpus},
        inter_op_parallelism_threads=2,
        intra_op_parallelism_threads=1,
    )


@pytest.fixture(autouse=True, scope="session")
def _kernel_timings_of_this_run(tmp_path_factory):
    """The start-up probe's timings (launch.kernels) cached in this run's own directory,
    for its processes too: kernels timed on a machine busy with tests are not for the
    user's cache."""
    os.environ["TOWERS_CACHE_DIR"] = str(tmp_path_factory.mktemp("kernel-timings"))


@pytest.fixture
def graph():
    """A fresh default graph per test, so variable names never collide."""
    g = tf.Graph()
    with g.as_default():
        yield g


@pytest.fixture
def keras_graph():
    """A fresh graph with Keras' layer names restarted (clear_session must come first)."""
    import keras

    keras.utils.clear_session()
    with tf.Graph().as_default() as graph:
        yield graph


@pytest.fixture(autouse=True)
def _processes_only_in_e2e(request, monkeypatch):
    """A test that starts a process must be marked e2e, so `-m "not e2e"` stays fast.

    Enforced rather than trusted: outside e2e, starting a subprocess fails the test.
    """
    if request.node.get_closest_marker("e2e") is not None:
        return

    def refuse(*args, **kwargs):
        raise AssertionError(f"{request.node.nodeid} starts a process: mark it @pytest.mark.e2e")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)


@pytest.fixture
def network():
    """A fresh network of test hosts (namespaces on a bridge); a test adds hosts with
    `network.add_host(name)`. Everything it made, processes first, is removed when
    the test ends, passed, failed or interrupted."""
    reason = net_hosts.why_unavailable()
    if reason is not None:
        pytest.skip(f"no test hosts: {reason}")
    net_hosts.sweep_stale()
    made = net_hosts.TestNetwork.create()
    try:
        yield made
    finally:
        made.close()
