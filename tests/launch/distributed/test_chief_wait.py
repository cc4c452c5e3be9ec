"""A non-chief worker waiting for the chief's initialisation rides out a ps restarted
meanwhile: a real ps process, killed and started again on its address."""

import subprocess
import sys
import threading
import time
import types

import pytest
import tensorflow as tf

from launch.distributed.arrangements.ps_worker import chief_wait
from launch.distributed.ports import free_ports

V1 = tf.compat.v1

SERVE_PS = """
import sys
import tensorflow as tf
ps, w0, w1 = sys.argv[1:]
server = tf.distribute.Server(tf.train.ClusterSpec({"ps": [ps], "worker": [w0, w1]}),
                              job_name="ps", task_index=0)
print("serving", flush=True)
server.join()
"""


def serve_ps(*addresses: str) -> subprocess.Popen:
    ps = subprocess.Popen([sys.executable, "-c", SERVE_PS, *addresses],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert ps.stdout.readline().strip() == "serving"
    return ps


@pytest.mark.e2e
def test_the_wait_for_the_chief_rides_out_a_ps_restarted_meanwhile(monkeypatch):
    """The soak (sync_backup seed 505): ps 0 was killed while a worker polled it for the
    chief's initialisation; the poll's UnavailableError ended the worker with exit 1
    and a traceback, where MonitoredSession would have recovered."""
    addresses = [f"127.0.0.1:{port}" for port in free_ports(3)]
    ps = serve_ps(*addresses)
    polled = threading.Event()
    monkeypatch.setattr(chief_wait, "time", types.SimpleNamespace(
        monotonic=time.monotonic, sleep=lambda secs: (polled.set(), time.sleep(secs))))
    spec = tf.train.ClusterSpec({"ps": [addresses[0]], "worker": addresses[1:]})
    worker = tf.distribute.Server(spec, job_name="worker", task_index=1)
    config = V1.ConfigProto(device_filters=["/job:ps", "/job:worker/task:1"])
    graph = tf.Graph()
    with graph.as_default(), tf.device("/job:ps/task:0"):
        weights = V1.get_variable("w", [], initializer=V1.zeros_initializer())
    failures = []

    def wait() -> None:
        try:
            with graph.as_default():
                chief_wait.wait_for_chief(worker.target, config, timeout=120, write=print)
        except Exception as err:  # noqa: BLE001 - the test reports whatever ended it
            failures.append(err)

    waiting = threading.Thread(target=wait)
    waiting.start()
    try:
        assert polled.wait(60), "the wait never polled"
        ps.kill()
        ps.wait(30)
        ps = serve_ps(*addresses)  # its start takes seconds: the wait polls meanwhile
        with V1.Session(worker.target, graph=graph, config=config) as chief:
            chief.run(weights.initializer)
        waiting.join(120)
    finally:
        ps.kill()
        ps.wait(30)
    assert not waiting.is_alive() and failures == [], failures
