"""A synchronous job's chief: its queue runner's expected cancellation is kept quiet only
while its training runs, and building a worker's hooks changes no process-wide state."""

import threading
import time

import tensorflow as tf

from launch.config import from_dict
from launch.distributed.arrangements.ps_worker import sync_replicas
from launch.distributed.arrangements.ps_worker.plan import worker_plan
from launch.distributed.arrangements.ps_worker.role import WorkerRole
from launch.distributed.cluster import Task
from launch.runtime.training_graph import build_training_graph

CANCELLED = tf.errors.CancelledError(None, None, "the session closed")


def raise_in_thread(name, error, after=0.0):
    def run():
        time.sleep(after)
        raise error

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def test_only_a_cancelled_queue_runner_is_kept_quiet_and_only_inside_the_block(monkeypatch):
    reported = []
    monkeypatch.setattr(threading, "excepthook", lambda args: reported.append(args.thread.name))
    before = threading.excepthook
    with sync_replicas.queue_runner_quiet():
        assert threading.excepthook is not before
        raise_in_thread("QueueRunnerThread-sync_token_q-enqueue", CANCELLED).join()
        raise_in_thread("QueueRunnerThread-sync_token_q-other", RuntimeError("a bug")).join()
        raise_in_thread("input", CANCELLED).join()
    assert threading.excepthook is before
    raise_in_thread("QueueRunnerThread-after", CANCELLED).join()
    assert reported == ["QueueRunnerThread-sync_token_q-other", "input",
                        "QueueRunnerThread-after"]


def test_leaving_the_block_waits_for_a_queue_runner_cancelled_as_the_session_closes(
        monkeypatch):
    reported = []
    monkeypatch.setattr(threading, "excepthook", lambda args: reported.append(args.thread.name))
    with sync_replicas.queue_runner_quiet():
        runner = raise_in_thread("QueueRunnerThread-late", CANCELLED, after=0.3)
    assert not runner.is_alive()
    assert reported == []


def test_building_a_sync_workers_hooks_leaves_threading_excepthook_alone():
    job = from_dict({"model": {"name": "mlp", "hidden_units": [8]}, "data": {"source": "synthetic"},
                     "train": {"batch_size": 64, "sync": True}, "towers": {"devices": 1}})
    task = Task({"ps": ("10.0.0.1:2222",), "worker": ("10.0.1.0:2222", "10.0.1.1:2222")},
                "worker", 0)
    plan = worker_plan(job, task)
    role = WorkerRole(job, task, type("Server", (), {"target": ""})())
    before = threading.excepthook
    with tf.Graph().as_default():
        build_training_graph(job, plan, role.wrap_optimizer)
        role.hooks(None, None)
    assert threading.excepthook is before
