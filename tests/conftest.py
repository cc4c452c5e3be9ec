"""Shared test set-up: graph mode, sessions with N CPU devices, the e2e tier kept honest."""

import gc
import json
import os
import subprocess

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
from helpers import net_hosts  # noqa: E402

from launch.log import quiet_tensorflow  # noqa: E402

# TensorFlow as every towers process starts it (launch.tf_process): without the modules
# it only tries, and Keras without its optional imports; the commands the tests run in
# this process through main() find it so. Collecting every test, 3 runs each alternated:
# 5.9-6.5 s of CPU and a peak of 556 MB against 6.5-7.4 s and 608 MB with a plain
# `import tensorflow`.
quiet_tensorflow()
# Keras too, before any test: h5py, which Keras imports, runs `uname -p` as it loads
# (platform.processor()), a process the fast tier's guard below would pin on whichever
# test first imported Keras.
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

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


def pytest_collection_finish(session):
    """Everything imported so far (TensorFlow, Keras, the project: ~370,000 objects) lives
    as long as the run: frozen out of the garbage collector's view, so that each full
    collection (every keras.utils.clear_session makes one) walks only what tests made,
    not all of TensorFlow again (0.2 s or more each, half a towers test's time)."""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """After a file's last test, its module fixtures torn down, what survives a full
    collection is frozen as well, so that later full collections do not walk it again.
    Graphs outlived their tests while the towers' synchronized moments and batch norm
    used tf.custom_gradient (TensorFlow's registry holds each gradient function, and so
    its graph, for good; towers.custom_gradient keeps them with their graph instead).
    The towers tests in one process spent 24 s of 152 s in 59 full collections without
    this, 3.7 s of 139 s with it (BENCHMARKS.md, "The test suite")."""
    yield
    if nextitem is None or _file_of(nextitem.nodeid) != _file_of(item.nodeid):
        gc.collect()
        gc.freeze()


# The order files are handed to the test workers. pytest-xdist's loadfile gives each
# worker the next file when it is free, but by default it sorts files by their number
# of tests, which puts the single-test end-to-end files (the longest, a minute or
# more each) last, where one of them can keep a worker busy while the others idle.
# Handing out the longest files first (longest-processing-time order) lets the many
# short files fill the gaps. xdist has no such order of its own, so the seconds each
# file took are recorded in FILE_SECONDS (refresh: `make test-durations`); a file not
# listed there goes after the listed ones. The Makefile passes --no-loadscope-reorder
# so xdist keeps this order.
FILE_SECONDS = os.path.join(os.path.dirname(__file__), "file_seconds.json")


def pytest_addoption(parser):
    parser.addoption("--write-file-seconds", action="store_true",
                     help=f"record each test file's seconds in {FILE_SECONDS}")


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config, items):
    try:
        with open(FILE_SECONDS) as f:
            seconds = json.load(f)
    except FileNotFoundError:
        return
    first_seen = {}
    for index, item in enumerate(items):
        first_seen.setdefault(_file_of(item.nodeid), index)
    items.sort(key=lambda item: (-seconds.get(_file_of(item.nodeid), 0.0),
                                 first_seen[_file_of(item.nodeid)]))


_seconds_taken: dict[str, float] = {}


def pytest_runtest_logreport(report):
    _seconds_taken[_file_of(report.nodeid)] = (
        _seconds_taken.get(_file_of(report.nodeid), 0.0) + report.duration)


def pytest_sessionfinish(session):
    if not session.config.getoption("--write-file-seconds") or hasattr(session.config,
                                                                       "workerinput"):
        return
    with open(FILE_SECONDS, "w") as f:
        json.dump({name: round(s, 1) for name, s in sorted(_seconds_taken.items())}, f,
                  indent=0)
        f.write("\n")
