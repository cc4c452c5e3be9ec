"""`towers worker`: train as one worker of a ps/worker job (worker 0, or the chief task, is chief).

    run_worker    the command: metrics, server, peers, then the training loop
    worker_plan   what this worker runs where: its towers, its share of the batch,
                  variables on the ps tasks, its session's options

A worker rides out a lost ps while MonitoredSession re-creates its session (the
chief restores the last checkpoint onto a restarted ps) and ends with status 138
once a ps has not answered for cluster.reconnect_timeout_secs, or a step has
waited out its deadline on a peer. The rest is a module each: what the loop asks
of a worker (worker_role), a synchronous job's optimizer (sync_replicas), the
bound on each step (step_deadline), a non-chief's wait for the chief
(chief_wait), when a lost peer ends a task (liveness) and how a worker ends from
its watch thread (hard_exit). How the job ends is in launch/distributed/ending.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable

import tensorflow as tf

import towers
from launch import hard_exit, metrics
from launch.config import JobConfig
from launch.distributed import collective, liveness, sync_replicas
from launch.distributed.cluster_spec import ClusterError, Task, wait_for_peers
from launch.distributed.server import start_server
from launch.distributed.step_deadline import stuck_step
from launch.distributed.worker_role import WorkerRole
from launch.errors import Diverged, PeerUnavailable
from launch.log import log
from launch.runtime.plan import Plan, make_plan
from launch.runtime.train import train

__all__ = ["WorkerRole", "identity", "run_worker", "worker_plan"]

V1 = tf.compat.v1


def worker_plan(job: JobConfig, task: Task) -> Plan:
    """The in-process plan moved onto this worker: towers on its devices, variables on ps."""
    if not task.cluster.get("ps"):
        raise ClusterError("cluster.ps: a ps/worker job needs at least one ps task")
    if job.towers.variable_update != "parameter_server":
        raise ClusterError(
            "towers.variable_update: ps/worker jobs keep variables on the ps tasks; "
            f"use parameter_server, not {job.towers.variable_update}"
        )
    if job.towers.batch_norm == "sync":
        # Workers run separate sessions that meet only through the ps variables: they
        # cannot join one another's collectives, so each would normalize by its own share.
        raise ClusterError(
            "towers.batch_norm: sync is not available in ps/worker jobs (workers do not "
            "share batch statistics); use local, or --backend horovod")
    base = make_plan(job, processes=task.num_workers)
    batch = towers.shard_sizes(job.train.batch_size, task.num_workers)[task.worker_rank]
    setter = V1.train.replica_device_setter(
        cluster=task.cluster_spec(),
        worker_device=task.device,
        ps_strategy=towers.GreedyByteBalancer(len(task.cluster["ps"])),
    )
    host = f"{task.device}/cpu:0"
    return dataclasses.replace(
        base,
        devices=[f"{task.device}{d}" for d in base.devices],
        param_device=setter,
        host=host,
        aggregation=host,
        batch_size=batch,
        shard=(task.worker_rank, task.num_workers),
        session=_worker_session(base.session, task, job.cluster),
    )


def _worker_session(base: V1.ConfigProto, task: Task, cfg) -> V1.ConfigProto:
    """Device filters, so workers never wait on each other; a bound on every operation,
    so a dead peer becomes an error instead of a hang. Training steps carry their own,
    tighter bound (StepDeadline); this one covers the rest, the sync chief's queue
    runner among them, whose first run waits as long as the first step."""
    config = V1.ConfigProto()
    config.CopyFrom(base)
    config.device_filters.extend(["/job:ps", task.device])
    longest = max(cfg.operation_timeout_secs, cfg.startup_timeout_secs)
    config.operation_timeout_in_ms = int(longest * 1000)
    return config


def run_worker(job: JobConfig, task: Task, write: Callable[[str], None] = log) -> dict:
    """Train as this worker; metrics (if on) start first, so a bad port fails fast."""
    if not task.cluster.get("ps"):  # no ps tasks: the workers all-reduce their gradients
        return collective.run_collective_worker(job, task, identity(job, task), write)
    with metrics.serve(job.metrics, identity(job, task), write) as exporter:
        plan = worker_plan(job, task)
        server = start_server(task, plan.session, write)
        wait_for_peers(task.peers(), job.cluster.startup_timeout_secs, write)
        write(f"worker rank {task.worker_rank} of ranks 0-{task.num_workers - 1}: "
              f"{plan.batch_size} of every {job.train.batch_size} examples, data shard "
              f"{task.worker_rank}")
        with _watching_ps(task, job, write), _quiet_queue_runner(task, job):
            role = WorkerRole(job, task, server, plan.session, write, exporter)
            return _train(job, task, plan, role, exporter, write)


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


def identity(job: JobConfig, task: Task) -> metrics.Identity:
    """The labels on this task's metrics (a ps's too): its job, task index and run."""
    return metrics.Identity(task.job_name, task.task_index, job.run.name)
