"""A synchronous ps/worker job (train.sync): TensorFlow's SyncReplicasOptimizer, fixed
where it does not fit a job whose workers start and restart on their own.

    wrap(...)             wraps the job's optimizer; each worker's local step on itself
    session_hook(...)     the optimizer's hook; the chief hands the others a token each
    OneTokenPerRound      a worker takes one token per update; its input follows its token
    queue_runner_quiet()  the chief's cancelled queue runner, without a traceback
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2
from tensorflow.python.ops import data_flow_ops

import towers
from launch.distributed.cluster import ClusterError, Task
from launch.distributed.health import ending

V1 = tf.compat.v1

QUEUE_RUNNER_WAIT_SECS = 5.0  # for the chief's runner to end once its session has closed
TOKEN_QUEUE = "sync_token_q"  # TensorFlow's name for it, shared by name


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

    def __init__(self, *args, worker_device: str, weight: float = 1.0, **kwargs):
        super().__init__(*args, **kwargs)
        self._worker_device = worker_device
        self._weight = weight

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        # Each worker's gradient (the mean over its part of the batch) is weighted by its
        # part (weight: part x workers / batch), as a process's towers are by theirs: the
        # accumulators average over the workers, which weighed the examples of a smaller
        # part more than one device would (3 workers of a batch of 32: 11, 11, 10).
        # A sparse gradient (an embedding's rows) is summed, each worker's already divided
        # by the gradients an update takes: TensorFlow's sparse accumulator would average
        # each row over the workers whose batch held it, so a row only one worker's part
        # held got replicas_to_aggregate times the update one device makes (a dense one
        # is averaged over them all).
        sparse_share = 1.0 / self._replicas_to_aggregate
        grads_and_vars = [(_weighed(grad, self._weight, sparse_share), var)
                          for grad, var in grads_and_vars]
        with tf.device(self._worker_device):
            applied = super().apply_gradients(grads_and_vars, global_step, name)
        self._build_clearing()
        self._keep_token_queue_open()
        return applied

    def _build_clearing(self) -> None:
        """The sparse accumulators made to sum (above), and the ops clear() runs."""
        self._count = V1.placeholder(tf.int32, [], name="sync_clear_count")
        self._clears = []  # (gradients held, the op taking them) per accumulator
        for accumulator, device in self._accumulator_list:
            sparse = isinstance(accumulator, data_flow_ops.SparseConditionalAccumulator)
            if sparse:
                # Its op is not yet run: the accumulator it makes on the ps sums.
                accumulator.accumulator_ref.op._set_attr(  # noqa: SLF001 (no public way)
                    "reduction_type", attr_value_pb2.AttrValue(s=b"SUM"))
            with tf.device(device):
                taken = (accumulator.take_indexed_slices_grad(self._count).values if sparse
                         else accumulator.take_grad(self._count))
            self._clears.append((accumulator.num_accumulated(), taken.op))
        queue = self._sync_token_queue
        self._clear_tokens = queue.dequeue_many(queue.size()).op

    def _keep_token_queue_open(self) -> None:
        """TensorFlow's chief runner closes the token queue as the chief's session stops;
        a queue on a ps is closed for good, so a chief started again while that ps ran
        on could hand out no token and failed ("FIFOQueue 'sync_token_q' is closed":
        soak seed 12). Its queue stays open: the workers waiting for a token when the
        job stops are woken by the tokens the chief releases (JobEndHook)."""
        runner = self._chief_queue_runner
        self._chief_queue_runner = V1.train.QueueRunner(
            runner.queue, runner.enqueue_ops, close_op=tf.no_op(name="sync_token_q_kept"),
            cancel_op=tf.no_op(name="sync_token_q_kept_on_cancel"))

    def clear(self, master: str, config: V1.ConfigProto) -> None:
        """The chief, before it restores or initialises the variables: take away what the
        ps tasks hold of an earlier run's updates, the gradients its accumulators hold
        and the tokens on its queue. A ps outlives the chief's restart: the gradient
        the chief's last run sent for the step it restores stayed in, and the restarted
        chief sent it again (that update held the chief's part twice and the other
        worker's not at all: soak seed 12); a token left there gave a worker the step of a
        run the restore undid. The workers still waiting are handed tokens of the
        restored step as the session starts (session_hook)."""
        with V1.Session(master, graph=self._count.graph, config=config) as sess:
            for held, take in self._clears:
                count = int(sess.run(held))
                if count:
                    sess.run(take, {self._count: count})
            sess.run(self._clear_tokens)

    def token_ps(self) -> int:
        """The ps task holding the token queue (the global step's), once built."""
        return tf.DeviceSpec.from_string(self._sync_token_queue.queue_ref.device).task or 0


def wake_workers(task: Task, token_ps: int) -> None:
    """A token for every worker, through the token queue's ps's own server (bounded): a
    worker blocked waiting for its next one, for an update that will never come (a
    worker diverged), wakes and sees why. The token's value (the local step it gives)
    does not matter: every worker stops after that step."""
    graph = tf.Graph()
    with graph.as_default(), tf.device(f"/job:ps/task:{token_ps}"):
        tokens = tf.queue.FIFOQueue(-1, tf.int64, shapes=[()], shared_name=TOKEN_QUEUE,
                                    name=TOKEN_QUEUE)
        wake = tokens.enqueue_many(tf.zeros([task.num_workers], tf.int64))
    try:
        ending.run_on_ps(task, token_ps, graph, wake, ending.REPORT_TIMEOUT_MS)
    except (tf.errors.DeadlineExceededError, tf.errors.UnavailableError,
            tf.errors.CancelledError):
        pass  # gone, or closed by the chief as it stopped: nobody is left waiting


def _weighed(grad, weight: float, sparse_share: float):
    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):
        factor = tf.cast(weight * sparse_share, grad.values.dtype)
        return tf.IndexedSlices(grad.values * factor, grad.indices, grad.dense_shape)
    return grad if weight == 1.0 else grad * tf.cast(weight, grad.dtype)


def wrap(base: V1.train.Optimizer, task: Task, backup_workers: int,
         batch_size: int) -> SyncReplicas:
    """`base` applying one update per step from every worker but `backup_workers`, each
    worker's gradient weighted by its part of the global batch of `batch_size`."""
    workers = task.num_workers
    part = towers.shard_sizes(batch_size, workers)[task.worker_rank]
    if workers - backup_workers < 1:
        raise ClusterError(
            f"train.backup_workers: {backup_workers} backups leave no worker "
            f"to aggregate among {workers}"
        )
    return SyncReplicas(
        base, replicas_to_aggregate=workers - backup_workers, total_num_replicas=workers,
        worker_device=task.device, weight=part * workers / batch_size,
    )


class OneTokenPerRound(V1.train.SessionRunHook):
    """A worker takes one token per update it contributes to, and its input goes on at
    the step of the token it holds.

    TensorFlow's tokens are shared: each update puts one on the queue for every worker,
    and a worker's step ends by taking whichever is first. A fast worker then took a
    slower one's token of the same update (with backup workers, every round: the slowest
    is still computing), computed a second gradient for that update from its next batch,
    and ran ahead of the global step: it trained its parts of later batches in earlier
    updates, and, its data out first, stopped the job a step or more before the data's
    passes ended (2 uninterrupted runs in 4 ended at step 62 or 63 of 64, every task
    exiting 0). So after each step: a token of an update this worker has already
    contributed to goes back on the queue (or, stale, its update done, is dropped), and
    the worker waits for the next update's; then its input goes on at that token's step
    (a worker that fell behind skips the parts whose updates went ahead without it:
    lost, as backup workers' parts are).

    follow: starts this worker's input at a global step's batch (DataPositionHook.follow).
    wait_secs: how long to wait for the next update, after a session's first step and
        after any later one (cluster.startup_timeout_secs, operation_timeout_secs).
    stopping: whether this process was asked to stop (a signal): it then waits for nothing.
    """

    POLL_SECS = 0.02

    def __init__(self, sync: SyncReplicas, global_step: tf.Tensor, stop_size: tf.Tensor,
                 follow: Callable[..., None], wait_secs: tuple[float, float],
                 stopping: Callable[[], bool] = lambda: False):
        self._sync, self._global_step, self._stop_size = sync, global_step, stop_size
        self._follow, self._wait_secs, self._stopping = follow, wait_secs, stopping
        self._used: int | None = None  # the local step of the step just run
        self._steps = 0  # of this session

    def begin(self) -> None:
        queue, local = self._sync._sync_token_queue, self._sync._local_step
        self._local = tf.identity(local)
        self._token = V1.placeholder(queue.dtypes[0], [])
        self._put_back = queue.enqueue(self._token)
        self._take = V1.assign(local, queue.dequeue())

    def after_create_session(self, session, coord) -> None:
        self._used = int(session.run(self._local))
        self._steps = 0

    def after_run(self, run_context, run_values) -> None:
        self._steps += 1
        if run_context.stop_requested or self._stopping():
            return  # this worker leaves: whatever token it took does not matter
        session = run_context.session
        taken = int(session.run(self._local))
        if taken <= self._used:
            try:
                taken = self._next_update_token(session, taken, self._used)
            except (tf.errors.CancelledError, tf.errors.OutOfRangeError):
                taken = None  # the token queue closed: the chief has stopped
            if taken is None:
                run_context.request_stop()  # the job stopped while this worker waited
                return
        self._follow(session, taken)
        self._used = taken

    def _next_update_token(self, session, taken: int, used: int) -> int | None:
        """Give back (or drop) a token of update `used` or earlier; wait for a later one.
        A global step below `used` is a checkpoint restored under this worker (a chief
        started again): it goes on at the restored step, the chief's tokens'."""
        # The first update of a session waits for every worker to start, as its first
        # step would (StepDeadline).
        deadline = time.monotonic() + self._wait_secs[0 if self._steps == 1 else 1]
        while True:
            step = int(session.run(self._global_step))
            if step < used:  # restored under it: as if it had sent nothing since
                used = step - 1
            if taken > used:
                return taken
            if taken >= step:  # its update is still to come: another worker's
                session.run(self._put_back, {self._token: taken})
            while step == used:  # the update this worker sent to is still to come
                if session.run(self._stop_size) or self._stopping():
                    return None
                if time.monotonic() > deadline:
                    raise tf.errors.DeadlineExceededError(
                        None, None, "no update came for this worker's next token")
                time.sleep(self.POLL_SECS)
                step = int(session.run(self._global_step))
            if step < used:  # restored under it while it waited: look again
                continue
            taken = int(session.run(self._take))


def session_hook(sync: SyncReplicas, is_chief: bool, workers: int) -> V1.train.SessionRunHook:
    """The optimizer's own hook (the chief's queue runner, the local-step initialiser),
    the chief handing a token of the step it starts at to every other worker: one that
    still waits for a token of an update the chief's restart undid goes on at that step
    (OneTokenPerRound keeps any worker from taking two, the chief included: without it,
    a chief up before the others filled the first update with its own gradients).
    """
    return sync.make_session_run_hook(is_chief, num_tokens=workers - 1 if is_chief else 0)


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
