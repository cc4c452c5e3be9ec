"""How a ps/worker job ends, so that no process waits forever.

- When the job stops for one worker it stops for all: the chief, when it stops
  (train.steps reached, or a stop signal), and any synchronous worker that runs out
  of data (a finite data set, `data.epochs`) put a token on the "stop" queue on ps 0,
  whose size every worker fetches with each step. Without that, a synchronous
  step would wait for ever for the gradient of a worker that has left. An
  asynchronous worker that has trained its parts of the data's passes stops no one:
  it waits until every worker has trained its own (the chief before its final
  checkpoint: launch.runtime.worker_positions), and then every task ends.
- A worker whose step diverged (a NaN or infinite loss or gradient, never
  applied) puts its rank on the "diverged" queue: every other worker stops at its
  next step with exit status 3 too, and the chief saves nothing after its last
  checkpoint, so an asynchronous job never goes on from weights it can no longer
  trust, exactly as a single process would not.
- In synchronous mode whoever stops the job also releases sync tokens, so a
  worker blocked waiting for its next token wakes up and sees the stop.
- The chief, once its final checkpoint is written, puts that checkpoint's step on
  the "final step" queue on ps 0, once for every other worker, and each of them
  takes it for its result: in an asynchronous job workers go on stepping while the
  job stops, so the step a worker last saw is not the step the job ended at.
- Every worker, once its training session has closed (the chief's final
  checkpoint written), puts its rank on a "finished" queue on every ps task (marked
  when the job diverged); a ps task exits when every worker has reported (the rest of
  its rules are in launch/distributed/arrangements/ps_worker/ps.py). A worker that
  starts after the job diverged stops before its first step, exit status 3, as long
  as the ps tasks are there to tell it: they wait for it (cluster.startup_timeout_secs).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import tensorflow as tf

from launch.distributed.cluster import Task
from launch.distributed.cluster.peers import accepts
from launch.errors import Diverged
from launch.runtime.hooks import DataEndHook

V1 = tf.compat.v1

QUEUE_CAPACITY = 1024  # far more than tokens ever sent; a full queue would block a worker
REPORT_TIMEOUT_MS = 10_000  # a ps that has gone cannot be told; it has stopped anyway
SESSION_TIMEOUT_MS = 5_000  # opening or closing a session of a ps's own server (ms on a live one)


def shared_queue(name: str, device: str) -> tf.queue.FIFOQueue:
    """A queue that lives on `device` and is shared by name across the cluster's graphs."""
    with tf.device(device):
        return tf.queue.FIFOQueue(
            QUEUE_CAPACITY, [tf.int32], shapes=[[]], shared_name=name, name=name
        )


def finished_queue(ps_index: int) -> tf.queue.FIFOQueue:
    return shared_queue(f"towers_finished_{ps_index}", f"/job:ps/task:{ps_index}")


def stop_queue() -> tf.queue.FIFOQueue:
    return shared_queue("towers_stop", "/job:ps/task:0")


def diverged_queue() -> tf.queue.FIFOQueue:
    return shared_queue("towers_diverged", "/job:ps/task:0")


def final_step_queue() -> tf.queue.FIFOQueue:
    return shared_queue("towers_final_step", "/job:ps/task:0")


class PeerDiverged(Diverged):
    """Another worker of the job diverged (its rank is in the message)."""


def peer_diverged(rank: int) -> PeerDiverged:
    return PeerDiverged(f"worker rank {rank} diverged (a NaN or infinite loss or gradient, "
                        "not applied); every worker of the job stops")


def diverged_before(task: Task) -> int | None:
    """The rank of the worker whose divergence ended the job, if it has (None: it has
    not, or ps 0 cannot say), read on ps 0 through its own server, bounded. For a worker
    starting: one that starts after the job diverged learns it before it waits for the
    chief, which has stopped."""
    graph = tf.Graph()
    with graph.as_default():
        queue = diverged_queue()
        size, which = queue.size(), queue.dequeue()
    try:
        if not run_on_ps(task, 0, graph, size, REPORT_TIMEOUT_MS):
            return None
        return int(run_on_ps(task, 0, graph, which, REPORT_TIMEOUT_MS))
    except (tf.errors.DeadlineExceededError, tf.errors.UnavailableError):
        return None


class JobEndHook(V1.train.SessionRunHook):
    """Every worker's part in ending the job (see the module docstring).

    release_tokens: the sync optimizer's op putting one token per worker on its
    token queue (None in asynchronous mode). data_end: says whether this worker's
    session ended because its data ran out (it runs before this hook).
    """

    def __init__(self, task: Task, release_tokens: tf.Operation | None,
                 data_end: DataEndHook, write: Callable[[str], None]):
        self._task, self._data_end, self._write = task, data_end, write
        stop, diverged, final = stop_queue(), diverged_queue(), final_step_queue()
        everyone = task.num_workers
        release = [release_tokens] if release_tokens is not None else []
        self._synchronous = release_tokens is not None
        self._sizes = {"stop": stop.size(), "diverged": diverged.size()}
        self._which_diverged = diverged.dequeue()
        self._signal_stop = stop.enqueue_many(tf.zeros([everyone], tf.int32))
        self._release = tf.group(*release)
        self._drain = [q.dequeue_many(q.size()) for q in (stop, diverged, final)]
        self.graph = tf.compat.v1.get_default_graph()
        self.peer_diverged: int | None = None

    def clear(self, master: str, config: V1.ConfigProto) -> None:
        """The chief, before it initialises or restores the variables: empty the queues
        of what an earlier run left on a ps that outlived it. Before, not after: the
        other workers start training as soon as the variables are ready, and a worker
        that diverges at once must find its rank still on the queue."""
        with V1.Session(master, graph=self.graph, config=config) as sess:
            sess.run(self._drain)

    def after_create_session(self, session, coord) -> None:
        """A worker that starts after the job diverged stops before its first step."""
        if session.run(self._sizes["diverged"]):
            self._peer_diverged(session)

    def before_run(self, run_context):
        return V1.train.SessionRunArgs(self._sizes)

    def after_run(self, run_context, run_values) -> None:
        if run_values.results["diverged"]:
            self._peer_diverged(run_context.session)
        if run_values.results["stop"]:
            run_context.request_stop()

    def _peer_diverged(self, session) -> None:
        self.peer_diverged = int(session.run(self._which_diverged))
        raise peer_diverged(self.peer_diverged)

    def end(self, session) -> None:
        out_of_data = self._data_end.ran_out
        rank = self._task.worker_rank
        if out_of_data and not self._synchronous:
            self._write(f"worker rank {rank} has trained its parts of the data's passes")
        elif out_of_data:
            self._write(f"worker rank {rank} ran out of data; stopping every worker of the job")
        if self._task.is_chief or (out_of_data and self._synchronous):
            session.run(self._signal_stop)
            release_tokens(session, self._release)


def release_tokens(session, release: tf.Operation) -> None:
    """Wake the workers blocked on their next sync token, so they see the stop. A token
    queue already closed (the chief closes it as its session stops) has nobody left to
    wake: every worker's step then ends, and the stop queue tells it why."""
    try:
        session.run(release)
    except (tf.errors.CancelledError, tf.errors.OutOfRangeError):
        pass


def tell_diverged(task: Task) -> None:
    """After this worker's session failed on a non-finite step: stop the others, whose
    steps read the diverged queue on ps 0. Through ps 0's own server, bounded (through
    this worker's, a session waits for a ps that has gone without end): a ps that is
    gone cannot pass it on, and nothing can train without it anyway. A synchronous job
    also wakes the workers waiting for a token (sync_replicas.wake_workers)."""
    graph = tf.Graph()
    with graph.as_default():
        ranks = tf.fill([task.num_workers], tf.constant(task.worker_rank, tf.int32))
        tell = diverged_queue().enqueue_many(ranks)
    try:
        run_on_ps(task, 0, graph, tell, REPORT_TIMEOUT_MS)
    except (tf.errors.DeadlineExceededError, tf.errors.UnavailableError):
        pass


def tell_final_step(task: Task, step: int) -> None:
    """The chief, its final checkpoint written: the job's last step, for every other
    worker's result. A ps that is gone cannot pass it on; they keep the step they saw."""
    if task.num_workers < 2:
        return
    graph = tf.Graph()
    with graph.as_default():
        tell = final_step_queue().enqueue_many(tf.fill([task.num_workers - 1], step))
    try:
        run_on_ps(task, 0, graph, tell, REPORT_TIMEOUT_MS)
    except (tf.errors.DeadlineExceededError, tf.errors.UnavailableError):
        pass


def final_step(task: Task, wait_secs: float) -> int | None:
    """A worker other than the chief: the step of the chief's final checkpoint, waiting
    for it at most wait_secs; None when it did not come (the chief failed, or ps 0 is
    gone). Asked in one-second slices, so a ps that leaves ends the wait at once."""
    graph = tf.Graph()
    with graph.as_default():
        take = final_step_queue().dequeue()
    deadline = time.monotonic() + wait_secs
    while (left := deadline - time.monotonic()) > 0:
        try:
            return int(run_on_ps(task, 0, graph, take, int(min(left, 1.0) * 1000)))
        except tf.errors.DeadlineExceededError:
            continue
        except (tf.errors.UnavailableError, tf.errors.CancelledError):
            return None
    return None


def report_finished(task: Task, write: Callable[[str], None], diverged: bool = False) -> None:
    """Tell every ps task this worker is done, after its training session; `diverged`:
    it ended on a non-finite step, its own or another worker's (a ps then waits for the
    workers still starting: launch/distributed/arrangements/ps_worker/ps.py)."""
    missed = 0
    for k in range(len(task.cluster["ps"])):
        graph = tf.Graph()
        with graph.as_default():
            report = finished_queue(k).enqueue(tf.constant(report_value(task.worker_rank,
                                                                        diverged)))
        try:
            run_on_ps(task, k, graph, report, REPORT_TIMEOUT_MS)
        except (tf.errors.DeadlineExceededError, tf.errors.UnavailableError):
            missed += 1
    if missed:
        write("could not report finished to every ps task; one has stopped already")


def report_value(rank: int, diverged: bool) -> int:
    """What a worker puts on the finished queues: its rank, or -1 - rank when the job
    diverged."""
    return -1 - rank if diverged else rank


def read_report(value: int) -> tuple[int, bool]:
    """(rank, the job diverged) from a value on a finished queue."""
    return (-1 - value, True) if value < 0 else (value, False)


def run_on_ps(task: Task, ps_index: int, graph: tf.Graph, fetch, wait_ms: int):
    """Run `fetch`, ops on ps task `ps_index` alone, through that task's own server
    (run_on_task).

    Not through this worker's server: a session there first looks up every device its
    filters name, and waits for a ps that has gone without end (TensorFlow's device
    search has no timeout), so a worker reporting to a ps that had stopped waited until
    its ps watch ended it, 138, after cluster.reconnect_timeout_secs. A session of the
    ps's own server needs no other task, and every call to it is bounded.
    """
    return run_on_task(f"ps {ps_index}", task.cluster["ps"][ps_index],
                       f"/job:ps/task:{ps_index}", graph, fetch, wait_ms)


def run_on_task(name: str, address: str, device: str, graph: tf.Graph, fetch, wait_ms: int):
    """Run `fetch`, ops on `device` alone, through the server at `address` of the task
    `name` says; the run waits at most wait_ms (DeadlineExceededError past it), opening
    and closing the session at most SESSION_TIMEOUT_MS each."""
    if not accepts(address):  # gone: a session would wait for it until its timeouts
        raise tf.errors.UnavailableError(None, None, f"{name} at {address} has gone")
    config = V1.ConfigProto(device_filters=[device], operation_timeout_in_ms=SESSION_TIMEOUT_MS)
    sess = V1.Session(f"grpc://{address}", graph=graph, config=config)
    try:
        return sess.run(fetch, options=V1.RunOptions(timeout_in_ms=wait_ms))
    finally:
        try:
            sess.close()
        except tf.errors.OpError:
            pass  # the task has gone: it holds nothing of this session any more
