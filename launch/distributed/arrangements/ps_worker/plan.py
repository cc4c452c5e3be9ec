"""What a worker of a ps/worker job runs where: the in-process plan moved onto the worker,
its variables on the ps tasks, its session's options."""

from __future__ import annotations

import dataclasses

import tensorflow as tf

import towers
from launch.config import ClusterConfig, JobConfig
from launch.distributed.cluster import Task
from launch.metrics.throughput import job_examples_per_global_step
from launch.runtime.plan import Plan, Share, make_plan

V1 = tf.compat.v1


def worker_plan(job: JobConfig, task: Task) -> Plan:
    """Towers on this worker's devices, variables on the ps tasks (byte-balanced); its
    share of every global batch and of the data is its worker rank's."""
    base = make_plan(job, Share(*task.share))
    setter = V1.train.replica_device_setter(
        cluster=task.cluster_spec(),
        worker_device=task.device,
        ps_strategy=towers.GreedyByteBalancer(len(task.cluster["ps"])),
    )
    host = f"{task.device}/cpu:0"
    # A synchronous update holds a gradient of every worker but the backups; an
    # asynchronous worker's step moves the global step by one.
    aggregated = task.num_workers - job.train.backup_workers if job.train.sync else 1
    return dataclasses.replace(
        base,
        devices=[f"{task.device}{d}" for d in base.devices],
        param_device=setter,
        host=host,
        aggregation=host,
        global_step_examples=job_examples_per_global_step(
            job.train.batch_size, task.num_workers, aggregated),
        session=worker_session(base.session, task, job.cluster),
    )


def worker_session(base: V1.ConfigProto, task: Task, cfg: ClusterConfig) -> V1.ConfigProto:
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
