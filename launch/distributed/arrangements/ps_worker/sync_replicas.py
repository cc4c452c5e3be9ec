"""A synchronous ps/worker job (train.sync): TensorFlow's SyncReplicasOptimizer, fixed
where it does not fit a job whose workers start and restart on their own.

    wrap(...)             wraps the job's optimizer; each worker's local step on itself
    session_hook(...)     the optimizer's hook, with no tokens handed out at the start
    queue_runner_quiet()  the chief's cancelled queue runner, without a traceback
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import tensorflow as tf

from launch.distributed.cluster import ClusterError, Task

V1 = tf.compat.v1

QUEUE_RUNNER_WAIT_SECS = 5.0  # for the chief's runner to end once its session has closed


class SyncReplicas(V1.train.SyncReplicasOptimizer):
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


def wrap(base: V1.train.Optimizer, task: Task, backup_workers: int) -> SyncReplicas:
    """`base` applying one update per step from every worker but `backup_workers`."""
    workers = task.num_workers
    if workers - backup_workers < 1:
        raise ClusterError(
            f"train.backup_workers: {backup_workers} backups leave no worker "
            f"to aggregate among {workers}"
        )
    return SyncReplicas(
        base, replicas_to_aggregate=workers - backup_workers, total_num_replicas=workers,
        worker_device=task.device,
    )


def session_hook(sync: SyncReplicas, is_chief: bool) -> V1.train.SessionRunHook:
    """The optimizer's own hook (the chief's queue runner, the local-step initialiser).

    No tokens at the start (TensorFlow's default gives replicas_to_aggregate): a
    chief up before the others would otherwise fill the first update with its own
    gradients alone; without backups every update then holds exactly one gradient
    from each worker, so a run is repeatable.
    """
    return sync.make_session_run_hook(is_chief, num_tokens=0)


@contextlib.contextmanager
def queue_runner_quiet() -> Iterator[None]:
    """While in the block (a synchronous chief's training), a queue runner's thread
    ended by CancelledError prints no traceback; any other thread's error still does.

    Closing the chief's session cancels its queue runner's wait for gradients that
    stopped workers will never send: an expected ending, which TensorFlow reports as
    an uncaught exception in that thread (threading.excepthook), just after the
    session has closed. So leaving the block first waits for those threads, at most
    QUEUE_RUNNER_WAIT_SECS, then puts the previous excepthook back.
    """
    previous = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        cancelled = isinstance(args.exc_value, tf.errors.CancelledError)
        if not (cancelled and _queue_runner(args.thread)):
            previous(args)

    threading.excepthook = hook
    try:
        yield
    finally:
        _join_queue_runners(QUEUE_RUNNER_WAIT_SECS)
        if threading.excepthook is hook:  # else someone replaced it since: theirs stays
            threading.excepthook = previous


def _queue_runner(thread: threading.Thread | None) -> bool:
    return thread is not None and thread.name.startswith("QueueRunnerThread")


def _join_queue_runners(timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for thread in threading.enumerate():
        if _queue_runner(thread) and thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))
