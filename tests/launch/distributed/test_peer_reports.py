"""What workers tell each other through ps 0: a worker that stops reporting is named
when a step stalls. The reports are read and written through real servers, in this
process (the straggler rule they feed: test_stragglers.py)."""

import time

import numpy as np
import pytest
import tensorflow as tf

from launch.distributed.cluster import Task
from launch.distributed.health.peer_reports import PeerReports, stall_cause, worker_names
from launch.distributed.ports import free_ports

V1 = tf.compat.v1


def row(alive_at=0.0, steps=0, own=0.0, input_wait=0.0, compute=0.0):
    return np.array([alive_at, steps, own, input_wait, compute], dtype=np.float64)


@pytest.fixture(scope="module")
def cluster():
    """1 ps and 2 workers, real servers on loopback; each worker's Task."""
    ps, w0, w1 = (f"127.0.0.1:{p}" for p in free_ports(3))
    spec = {"ps": (ps,), "worker": (w0, w1)}
    servers = [tf.distribute.Server(tf.train.ClusterSpec({k: list(v) for k, v in spec.items()}),
                                    job_name=job, task_index=i, start=True)
               for job, i in (("ps", 0), ("worker", 0), ("worker", 1))]
    return spec, servers


def reports_of(cluster, index):
    spec, servers = cluster
    task = Task(spec, "worker", index)
    graph = tf.Graph()
    with graph.as_default():
        reports = PeerReports(task)
    return reports, V1.Session(servers[1 + index].target, graph=graph)


def test_a_worker_that_stopped_reporting_is_named_by_the_one_waiting(cluster):
    (chief, chief_session), (other, other_session) = reports_of(cluster, 0), reports_of(cluster, 1)
    chief.initialise(chief_session)
    other.initialise(other_session)
    now = time.time()
    chief.publish(chief_session, row(now, 10, 0.01))
    other.publish(other_session, row(now - 9, 9, 0.01))  # its last report, 9 s ago
    cause = stall_cause(chief, chief_session, sync=True)
    address = cluster[0]["worker"][1]
    assert cause == (f"workers not reporting: worker 1 at {address} (silent for 9 s); "
                     "the synchronous step waits for their gradients")
    other.publish(other_session, row(now, 9, 0.01))  # reporting again, a step behind
    assert stall_cause(chief, chief_session, sync=True) == (
        f"the synchronous step waits for worker 1 at {address}, steps behind the others")


def test_an_unstarted_report_is_not_a_silent_ps():
    ps, w0 = (f"127.0.0.1:{p}" for p in free_ports(2))
    spec = {"ps": (ps,), "worker": (w0,)}
    servers = [tf.distribute.Server(tf.train.ClusterSpec({k: list(v) for k, v in spec.items()}),
                                    job_name=job, task_index=0) for job in ("ps", "worker")]
    graph = tf.Graph()
    with graph.as_default():
        reports = PeerReports(Task(spec, "worker", 0))
    with V1.Session(servers[1].target, graph=graph) as session:
        assert "not all started reporting" in stall_cause(reports, session, sync=True)


def test_workers_are_named_by_task_and_address():
    task = Task({"ps": ("p:1",), "chief": ("c:1",), "worker": ("w:1", "w:2")}, "chief", 0)
    assert worker_names(task) == ["chief 0 at c:1", "worker 0 at w:1", "worker 1 at w:2"]
