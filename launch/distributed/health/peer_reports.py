"""What each worker of a ps/worker job tells the others through ps 0, and what is read
from it: which workers have stopped reporting (a stall), and which is a straggler.

Every worker owns a small variable on ps 0 (`towers_worker_report_<rank>`, five
float64s) and rewrites it once a second from a thread of its own, with a session run
of its own: when it wrote, how many steps it has finished, and its recent own time per
step, input wait and compute (launch/distributed/stragglers.py's `OwnTimes`). No extra
port and nothing in the checkpoints: the variables are in no collection, and each
worker initialises the ones it finds uninitialised.

The chief reads them all once a second and names stragglers by stragglers.py's rule.
Any worker reads them when its steps stall (launch/runtime/stall.py).
"""

from __future__ import annotations

import time

import numpy as np
import tensorflow as tf

from launch.distributed.cluster import Task
from launch.distributed.health.stragglers import (
    ALIVE_AT,
    STEPS,
    TIMES,
    OwnTimes,
    Publisher,
    StragglerWatch,
    silent_peers,
)

V1 = tf.compat.v1

RPC_TIMEOUT_MS = 3000


def worker_names(task: Task) -> list[str]:
    """'chief 0 at host:port', 'worker 1 at host:port', ... in worker-rank order."""
    names = [f"chief 0 at {a}" for a in task.cluster.get("chief", ())]
    return names + [f"worker {i} at {a}" for i, a in enumerate(task.cluster.get("worker", ()))]


class PeerReports:
    """The report variables and the ops to write this worker's and read every one.

    Built in the training graph (before the session is made): variables on ps 0.
    """

    def __init__(self, task: Task):
        self.task = task
        self.names = worker_names(task)
        with tf.device("/job:ps/task:0/cpu:0"):
            self._rows = [V1.Variable(tf.zeros([5], tf.float64), trainable=False,
                                      collections=[], name=f"towers_worker_report_{i}")
                          for i in range(task.num_workers)]
        self._feed = V1.placeholder(tf.float64, [5], name="towers_report_feed")
        self._write = self._rows[task.worker_rank].assign(self._feed).op
        self._read = tf.stack(self._rows)
        self._ready = [v.is_initialized() for v in self._rows]
        self._inits = [v.initializer for v in self._rows]
        self._options = V1.RunOptions(timeout_in_ms=RPC_TIMEOUT_MS)

    def initialise(self, session) -> None:
        """Initialise the rows no worker has yet (a race between workers only writes zeros)."""
        ready = session.run(self._ready, options=self._options)
        todo = [init for init, done in zip(self._inits, ready, strict=True) if not done]
        if todo:
            session.run(todo, options=self._options)

    def publish(self, session, row: np.ndarray) -> None:
        session.run(self._write, feed_dict={self._feed: row}, options=self._options)

    def read(self, session) -> np.ndarray:
        """[num_workers, 5]; raises tf.errors.OpError when ps 0 does not answer in time."""
        return session.run(self._read, options=self._options)


def stall_cause(reports: PeerReports, session, sync: bool) -> str:
    """What a stalled worker's step waits for, from the reports (or ps 0's silence)."""
    task = reports.task
    try:
        rows = reports.read(session)
    except tf.errors.FailedPreconditionError:
        return "the workers have not all started reporting (the job is starting)"
    except (tf.errors.OpError, RuntimeError):
        return f"ps 0 at {task.cluster['ps'][0]} is not answering"
    silent = silent_peers(rows[:, ALIVE_AT], reports.names, task.worker_rank, time.time())
    if silent:
        waits = "the synchronous step waits for their gradients" if sync else \
            "they are not training"
        return f"workers not reporting: {', '.join(silent)}; {waits}"
    behind = [reports.names[i] for i, row in enumerate(rows)
              if i != task.worker_rank and row[STEPS] < rows[:, STEPS].max()]
    if sync and behind:
        return f"the synchronous step waits for {', '.join(behind)}, steps behind the others"
    return "every worker reports; the step waits inside TensorFlow (a ps busy or slow)"


class PeerReportHook(Publisher):
    """Publishes this worker's report once a second; on the chief, `stragglers` judges
    every worker's. `times.on_phases` listens to this worker's step phases."""

    thread_name = "PeerReports"

    def __init__(self, reports: PeerReports, stragglers: StragglerWatch | None):
        super().__init__()
        self.reports = reports
        self.times = OwnTimes()
        self._stragglers = stragglers
        self.session = None

    def after_create_session(self, session, coord) -> None:
        self.session = session  # the latest: MonitoredSession re-creates it after a lost ps
        try:
            self.reports.initialise(session)
        except (tf.errors.OpError, RuntimeError):
            pass  # ps 0 busy: the next session (or another worker) initialises them
        super().after_create_session(session, coord)

    def publish(self) -> None:
        row = np.zeros(5)
        row[ALIVE_AT], row[STEPS], row[TIMES] = time.time(), self.times.steps, \
            self.times.medians
        try:
            self.reports.publish(self.session, row)
            if self._stragglers is not None:
                rows = self.reports.read(self.session)
                self._stragglers.look(rows, self.reports.names, self.times.steps)
        except (tf.errors.OpError, RuntimeError):
            pass  # ps 0 not answering: the ps watch and the stall watch say so
