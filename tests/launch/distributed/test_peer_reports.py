"""What workers tell each other through ps 0: a worker that stops reporting is named
when a step stalls, and a worker whose own time per step stays a clear margin above the
others' is named a straggler, with whether it waits on input or on compute. The reports
are read and written through real servers, in this process."""

import time

import numpy as np
import pytest
import tensorflow as tf

from launch.distributed.cluster_spec import Task
from launch.distributed.local_cluster import free_ports
from launch.distributed.peer_reports import (
    PeerReports,
    Straggler,
    stall_cause,
    straggler_line,
    worker_names,
)

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


def test_a_straggler_is_named_after_the_window_and_only_it():
    judge = Straggler(ratio=1.5, steps=50)
    rows = np.stack([row(own=0.010), row(own=0.031, input_wait=0.025, compute=0.005),
                     row(own=0.011)])
    assert judge.judge(rows, 100) == ([], [])  # slow from step 100 on
    assert judge.judge(rows, 149) == ([], [])
    assert judge.judge(rows, 150) == ([1], [])  # 50 steps later: named once
    assert judge.judge(rows, 151) == ([], [])
    rows[1] = row(own=0.012)
    assert judge.judge(rows, 152) == ([], [1])  # caught up


def test_a_worker_slow_for_less_than_the_window_is_not_named():
    judge = Straggler(ratio=1.5, steps=50)
    slow = np.stack([row(own=0.01), row(own=0.03)])
    fast = np.stack([row(own=0.01), row(own=0.011)])
    for step, rows in ((0, slow), (40, fast), (45, slow), (90, slow)):
        assert judge.judge(rows, step) == ([], [])


def test_the_straggler_line_says_how_much_slower_and_on_what():
    task = Task({"ps": ("p:1",), "chief": ("c:1",), "worker": ("w:1", "w:2")}, "chief", 0)
    names = worker_names(task)
    assert names == ["chief 0 at c:1", "worker 0 at w:1", "worker 1 at w:2"]
    rows = np.stack([row(own=0.01), row(own=0.01),
                     row(own=0.04, input_wait=0.001, compute=0.035)])
    assert straggler_line(rows, names, 2) == (
        "straggler: worker 1 at w:2 takes 4.0x the others' median time of its own per step "
        "(0.040 s against 0.010 s), mostly compute (0.001 s input wait, 0.035 s compute)")
