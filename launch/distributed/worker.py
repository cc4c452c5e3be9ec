"""`towers worker`: train as one worker of a ps/worker job (worker 0, or the chief task, is chief).

A worker that loses a ps task keeps going while MonitoredSession re-creates its
session (the chief restores the last checkpoint onto a restarted ps), but gives
up with status 138 once a ps task has refused connections for
`reconnect_timeout_secs` (launch/distributed/liveness.py): TensorFlow alone would
retry forever. A step stuck for `operation_timeout_secs` on a peer that does not
answer (a synchronous step waiting for a worker cut off from the network) ends the
worker with 138 too. How the job ends is in launch/distributed/ending.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable

import tensorflow as tf

import towers
from launch import metrics
from launch.config import JobConfig
from launch.distributed import hard_exit, liveness
from launch.distributed.cluster_spec import ClusterError, Task, wait_for_peers
from launch.distributed.ending import JobEndHook, report_finished, tell_diverged
from launch.distributed.server import start_server
from launch.errors import Diverged, PeerUnavailable
from launch.log import log
from launch.runtime.plan import Plan, make_plan
from launch.runtime.role import Role
from launch.runtime.train import train

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
    base = make_plan(job)
    sizes = towers.shard_sizes(job.train.batch_size, task.num_workers)
    batch = sizes[task.worker_rank]
    micro = job.train.accumulate_steps
    if min(sizes) < len(base.devices) * micro:
        each = f" in some of its {micro} micro-batches" if micro > 1 else ""
        raise ClusterError(
            f"train.batch_size: a global batch of {job.train.batch_size} over "
            f"{task.num_workers} workers with {len(base.devices)} tower(s) each leaves a "
            f"tower without examples{each}"
        )
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
    with metrics.serve(job.metrics, identity(job, task), write) as exporter:
        plan = worker_plan(job, task)
        server = start_server(task, plan.session, write)
        wait_for_peers(task.peers(), job.cluster.startup_timeout_secs, write)
        write(f"worker rank {task.worker_rank} of ranks 0-{task.num_workers - 1}: "
              f"{plan.batch_size} of every {job.train.batch_size} examples, data shard "
              f"{task.worker_rank}")
        with _watching_ps(task, job, write):
            role = WorkerRole(job, task, server, plan.session, write)
            try:
                return train(job, plan=plan, role=role, exporter=exporter, write=write)
            except Diverged:
                role.diverged()
                raise
            except tf.errors.DeadlineExceededError:
                raise PeerUnavailable(_stuck_step(task, role.deadline)) from None


def _watching_ps(task: Task, job: JobConfig,
                 write: Callable[[str], None]) -> contextlib.AbstractContextManager:
    """While in the block, a ps lost for the reconnect timeout ends this process with
    138: MonitoredSession re-creates the session after a lost ps, which rides out a
    ps that is restarted (the chief restores the last checkpoint onto it), but would
    retry one that is gone for ever."""
    ps_tasks = {f"ps {i}": a for i, a in enumerate(task.cluster["ps"])}
    ps = liveness.Liveness(ps_tasks, liveness.worker_rule(job.cluster), write)
    return liveness.watching(ps, hard_exit.exit_now)


def _stuck_step(task: Task, deadline: StepDeadline) -> str:
    """What to say when a step waited `timeout_secs` for its peers: those not answering."""
    others = {
        f"{job} {i}": a
        for job in ("ps", "chief", "worker")
        for i, a in enumerate(task.cluster.get(job, ()))
        if (job, i) != (task.job_name, task.task_index)
    }
    silent = [f"{name} at {a}" for name, a in liveness.not_answering(others).items()]
    who = f"not answering: {', '.join(silent)}" if silent else "every peer answers"
    secs, key = deadline.current
    return (
        f"cluster: a step waited {secs:g} s (cluster.{key}) for its peers; {who}. "
        "Restart the job's tasks: training resumes from the last checkpoint"
    )


class StepDeadline(V1.train.SessionRunHook):
    """Bounds every training step, so a peer that stopped answering ends the step with
    DeadlineExceededError instead of a hang. A session's first step may wait up to
    cluster.startup_timeout_secs: in a synchronous job it waits for every worker to
    start, which can take longer than any later step should. Later steps wait up to
    cluster.operation_timeout_secs.
    """

    def __init__(self, cfg):
        self._first = (cfg.startup_timeout_secs, "startup_timeout_secs")
        self._later = (cfg.operation_timeout_secs, "operation_timeout_secs")
        self.current = self._first
        self._started = False

    def after_create_session(self, session, coord) -> None:
        self._started = False  # MonitoredSession re-creates it after a lost ps

    def before_run(self, run_context):
        self.current = self._later if self._started else self._first
        options = V1.RunOptions(timeout_in_ms=int(self.current[0] * 1000))
        return V1.train.SessionRunArgs(None, options=options)

    def after_run(self, run_context, run_values) -> None:
        self._started = True


class WorkerRole(Role):
    """A worker of a ps/worker job: its server's session, chief or not, synchronous or not.

    The sync chief's queue-runner thread may be blocked for good on gradients
    from workers that have already stopped, so closing waits only briefly for it:
    by then the final checkpoint is written.
    """

    def __init__(self, job: JobConfig, task: Task, server, session: V1.ConfigProto,
                 write: Callable[[str], None] = log):
        super().__init__(
            master=server.target,
            is_chief=task.is_chief,
            writes=task.is_chief,
            max_wait_secs=job.cluster.startup_timeout_secs,
            stop_grace_secs=1.0,
        )
        self._job, self._task, self._session = job, task, session
        self._write = write
        self._sync: V1.train.SyncReplicasOptimizer | None = None
        self._end: JobEndHook | None = None
        self.deadline = StepDeadline(job.cluster)

    def wrap_optimizer(self, optimizer: V1.train.Optimizer) -> V1.train.Optimizer:
        if not self._job.train.sync:
            return optimizer
        workers, backups = self._task.num_workers, self._job.train.backup_workers
        if workers - backups < 1:
            raise ClusterError(
                f"train.backup_workers: {backups} backups leave no worker "
                f"to aggregate among {workers}"
            )
        self._sync = _SyncReplicas(
            optimizer, replicas_to_aggregate=workers - backups, total_num_replicas=workers,
            worker_device=self._task.device,
        )
        return self._sync

    def hooks(self, ops: towers.TrainOps) -> list[V1.train.SessionRunHook]:
        release = None
        if self._sync is not None:
            release = self._sync.get_init_tokens_op(num_tokens=self._task.num_workers)
        self._end = JobEndHook(self._task, release, self._write)
        if self._sync is None:
            return [self._end, self.deadline]
        _quiet_cancelled_queue_runners()
        # No tokens at the start (TensorFlow's default gives replicas_to_aggregate):
        # a chief up before the others would otherwise fill the first update with its
        # own gradients alone; without backups every update then holds exactly one
        # gradient from each worker, so a run is repeatable.
        sync = self._sync.make_session_run_hook(self._task.is_chief, num_tokens=0)
        return [self._end, sync, self.deadline]

    def before_session(self, config: V1.ConfigProto) -> None:
        if self.is_chief:
            self._end.clear(self.master, config)
        else:
            _wait_for_chief(self.master, config, self.max_wait_secs)

    def unblock_op(self) -> tf.Operation | None:
        """One token, for this worker's own blocked step (see StopOnSignalHook)."""
        return None if self._sync is None else self._sync.get_init_tokens_op(num_tokens=1)

    def finish(self, result: dict) -> dict:
        report_finished(self._task, self.master, self._session, self._write)
        return {**result, "job": self._task.job_name, "task": self._task.task_index}

    def diverged(self) -> None:
        """This worker's session ended on a non-finite step, its own or another's: make
        sure every worker stops, and tell the ps tasks this one is done."""
        if self._end is not None and self._end.peer_diverged is None:
            tell_diverged(self._end, self.master, self._session)
        report_finished(self._task, self.master, self._session, self._write)


def _wait_for_chief(master: str, config: V1.ConfigProto, timeout: float) -> None:
    """Poll every half second until the chief has initialised the variables.

    MonitoredTrainingSession's own wait re-checks only every 30 s, which would idle
    every non-chief worker for that long at each start.
    """
    # Global variables only: local ones (the loss scale, this worker's own step) are
    # each worker's own to initialise.
    uninitialized = V1.report_uninitialized_variables(V1.global_variables())
    deadline = time.monotonic() + timeout
    with V1.Session(master, config=config) as sess:
        while len(sess.run(uninitialized)):
            if time.monotonic() > deadline:
                raise PeerUnavailable(
                    f"cluster: the chief did not initialise the variables within {timeout:g} s"
                )
            time.sleep(0.5)


class _SyncReplicas(V1.train.SyncReplicasOptimizer):
    """TensorFlow's SyncReplicasOptimizer with each worker's local step on that worker.

    TensorFlow makes the local step (the global step a worker's gradients were
    computed at) beside an op with no device, and assigns each new token to it on
    the ps, so the placer puts it on the ps, one variable for every worker, shared
    by name. A worker starting later then resets it to 0 (the local-variable
    initialiser) under a worker already running, whose gradients the accumulators
    drop as stale: on a resumed job that is every gradient of the first step, and
    with no tokens handed out at the start, the job waits for ever.
    """

    def __init__(self, *args, worker_device: str, **kwargs):
        super().__init__(*args, **kwargs)
        self._worker_device = worker_device

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        with tf.device(self._worker_device):
            return super().apply_gradients(grads_and_vars, global_step, name)


def _quiet_cancelled_queue_runners() -> None:
    """Don't print a traceback for the sync chief's queue runner cancelled at shutdown.

    Closing the chief's session cancels the runner's wait for gradients that
    stopped workers will never send (see run_worker); that ending is expected.
    """
    default = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        cancelled = isinstance(args.exc_value, tf.errors.CancelledError)
        if not (cancelled and args.thread and args.thread.name.startswith("QueueRunnerThread")):
            default(args)

    threading.excepthook = hook


def identity(job: JobConfig, task: Task) -> metrics.Identity:
    return metrics.Identity(task.job_name, task.task_index, job.run.name)
