"""`towers worker` in a ps/worker job: metrics, server, peers, then the training loop
(worker 0, or the chief task, is chief).

A worker rides out a lost ps while MonitoredSession re-creates its session (the
chief restores the last checkpoint onto a restarted ps) and ends with status 138
once a ps has not answered for cluster.reconnect_timeout_secs, or a step has
waited out its deadline on a peer. What the loop asks of a worker is role.py, a
synchronous job's optimizer sync_replicas.py, a non-chief's wait for the chief
chief_wait.py; the bound on each step, when a lost peer ends a task and how the job
ends are in launch/distributed/health/, and how a worker ends from its watch thread
in launch/hard_exit.py.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import tensorflow as tf

from launch import hard_exit, metrics
from launch.config import JobConfig
from launch.distributed.arrangements.ps_worker import sync_replicas
from launch.distributed.arrangements.ps_worker.plan import worker_plan
from launch.distributed.arrangements.ps_worker.role import WorkerRole
from launch.distributed.cluster import Task
from launch.distributed.cluster.peers import wait_for_peers
from launch.distributed.cluster.server import start_server
from launch.distributed.health import ending, liveness
from launch.distributed.health.step_deadline import stuck_step
from launch.errors import Diverged, PeerUnavailable
from launch.log import log
from launch.runtime.plan import Plan
from launch.runtime.train import train

V1 = tf.compat.v1


def run_worker(job: JobConfig, task: Task, write: Callable[[str], None] = log) -> dict:
    """Train as this worker; metrics (if on) start first, so a bad port fails fast."""
    identity = metrics.Identity(task.job_name, task.task_index, job.run.name)
    with metrics.serve(job.metrics, identity, write) as exporter:
        plan = worker_plan(job, task)
        server = start_server(task, plan.session, write)
        _wait_for_peers(job, task, write)
        write(f"worker rank {task.worker_rank} of ranks 0-{task.num_workers - 1}: "
              f"{plan.process_batch_size} examples of every global batch of {job.train.batch_size} "
              f"(part {task.worker_rank + 1} of {task.num_workers})")
        with _watching_ps(task, job, write), _quiet_queue_runner(task, job):
            role = WorkerRole(job, task, server, write, exporter)
            return _train(job, task, plan, role, exporter, write)


def _wait_for_peers(job: JobConfig, task: Task, write: Callable[[str], None]) -> None:
    """Wait for the ps tasks, then (not the chief) for the chief, within one
    cluster.startup_timeout_secs; a worker starting after the job diverged (the chief
    has stopped) learns it from ps 0 in between, and stops with exit status 3."""
    deadline = time.monotonic() + job.cluster.startup_timeout_secs
    peers = task.peers()
    ps_tasks = {name: address for name, address in peers.items() if name.startswith("ps ")}
    wait_for_peers(ps_tasks, job.cluster.startup_timeout_secs, write)
    if task.is_chief:
        return
    rank = ending.diverged_before(task)
    if rank is not None:
        ending.report_finished(task, write, diverged=True)
        raise ending.peer_diverged(rank)
    wait_for_peers(peers, max(0.0, deadline - time.monotonic()), write)


def _watching_ps(task: Task, job: JobConfig,
                 write: Callable[[str], None]) -> contextlib.AbstractContextManager:
    """While in the block, a ps lost for the reconnect timeout ends this process with
    138: MonitoredSession re-creates the session after a lost ps, which rides out a
    ps that is restarted (the chief restores the last checkpoint onto it), but would
    retry one that is gone for ever."""
    ps_tasks = {f"ps {i}": a for i, a in enumerate(task.cluster["ps"])}
    ps = liveness.Liveness(ps_tasks, liveness.worker_rule(job.cluster), write)
    return liveness.watching(ps, hard_exit.exit_now)


def _quiet_queue_runner(task: Task, job: JobConfig) -> contextlib.AbstractContextManager:
    """A sync chief's queue runner is cancelled when its session closes: say nothing."""
    sync_chief = job.train.sync and task.is_chief
    return sync_replicas.queue_runner_quiet() if sync_chief else contextlib.nullcontext()


def _train(job: JobConfig, task: Task, plan: Plan, role: WorkerRole,
           exporter: metrics.Exporter | None, write: Callable[[str], None]) -> dict:
    """The training loop, with a worker's own endings: a diverged step stops every
    worker of the job; a step that ran out of its deadline waited on a lost peer."""
    try:
        return train(job, plan=plan, role=role, exporter=exporter, write=write)
    except Diverged:
        role.diverged()
        raise
    except tf.errors.DeadlineExceededError:
        raise PeerUnavailable(stuck_step(task, role.deadline)) from None
