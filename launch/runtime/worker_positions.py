"""Asynchronous ps/worker: each worker's data position, held with the variables on the ps.

Each asynchronous worker trains its part of the global batches at its own pace, so the
global step does not say where the data stands (it moves by one at every worker's step).
Each worker has its own position instead (launch.data.position): a variable of one
int64 per worker on a ps task (``towers_data/worker_positions_live``), which a worker's
step moves on by the global batch in the same run as its update, after the update is
applied. So the live positions count exactly the parts whose updates the ps tasks have:
a worker restarted alone (the ps tasks and the others running on) reads its own and
goes on at its next part. A chief restarted alone restores its last checkpoint onto
the ps under the running workers; each finds its position moved after its next step
(launch.runtime.data_state) and goes on at the restored one: that step's part is
trained again later (once more).

A checkpoint is read while the workers go on applying updates, so it keeps a copy of
the positions taken *before* the save reads any variable (``towers_data/worker_positions``):
every part it counts is in the saved weights; a part applied between the copy and the
save's reads may be in them too and is trained again after a restore (once more). The
live variable is not saved. A checkpoint of another number of workers, or of another
arrangement (no positions), restores with every worker at the lowest position, or at
the checkpoint's data position (launch/runtime/positions_saver.py does this).

The same copy also moves the data state's base to the lowest position at the copy's
global step, so that another arrangement resumed from the checkpoint starts there (it
counts from the step the save read, which the workers may have moved on a step or two
since the copy: those global batches are skipped).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import tensorflow as tf

import towers
from launch.errors import PeerUnavailable
from launch.runtime.checkpoints import DATA_SCOPE, RESTORED_APART

V1 = tf.compat.v1
POLL_SECS = 0.5


class WorkerPositions:
    """The positions of ``workers`` asynchronous workers of global batches of
    ``global_batch`` examples, made in the default graph on ``device`` (the global step's:
    a ps task); ``rank`` is this worker's."""

    def __init__(self, workers: int, rank: int, global_batch: int, device):
        self.workers, self.rank, self.global_batch = workers, rank, global_batch
        self.parts = towers.shard_sizes(global_batch, workers)  # worker i's examples of each
        with V1.device(device), V1.variable_scope(DATA_SCOPE):
            self.live, self.saved = (
                V1.get_variable(name, [workers], tf.int64, V1.zeros_initializer(),
                                trainable=False, use_resource=True)
                for name in ("worker_positions_live", "worker_positions"))
        for variable in (self.live, self.saved):
            V1.add_to_collection(RESTORED_APART, variable)
        self.values = self.live.read_value()  # int64 [workers]
        self._fed = V1.placeholder(tf.int64, [workers], name="worker_positions_fed")
        self._set = tf.group(self.live.assign(self._fed), self.saved.assign(self._fed))
        self._restore_live = self.live.assign(self.saved.read_value())
        self._own = V1.placeholder(tf.int64, [], name="worker_position_fed")
        self._put_back = V1.scatter_update(self.live, [rank], [self._own])
        self.after_step: tf.Tensor | None = None  # made with the step (advanced_by)
        self.restored: list[int] | None = None  # what a restore of other positions found

    def advanced_by(self, update: tf.Operation) -> tf.Operation:
        """``update`` (a worker's training step), then this worker's position moved on by
        a global batch: a step that fails before its update is applied does not count."""
        with tf.control_dependencies([update]):
            advance = V1.scatter_add(self.live, [self.rank], [self.global_batch])
        with tf.control_dependencies([advance]):
            self.after_step = self.live.read_value()  # int64 [workers], as the step left them
        return tf.group(update, advance)

    def put_back(self, session, position: int) -> None:
        """This worker's live position set to ``position``."""
        session.run(self._put_back, {self._own: position})

    def read(self, session) -> list[int]:
        return [int(v) for v in session.run(self.values)]

    def set(self, session, positions: list[int]) -> None:
        """Every worker's position, live and in the copy a checkpoint keeps."""
        session.run(self._set, {self._fed: positions})

    def take_saved(self, session) -> None:
        """The live positions from the copy (just restored from a checkpoint)."""
        session.run(self._restore_live)


class OthersPartsHook(V1.train.SessionRunHook):
    """A worker that has trained its own parts of the data's passes: wait, as its session
    ends, until every worker has trained its own, so the job's tasks end together and the
    chief's last checkpoint (this hook runs before the saver's end) holds every part.

    left: the parts each worker has left, given the positions. stopped: a stop was asked
    for (then no wait). wait_secs: how long the positions may stand still before the
    worker stops waiting (a worker that is gone: its parts are left for a resume).
    on_wait: called before it waits (the stall watch stops: no step is due).

    untrained: why the data's passes are not all trained when the wait ended without
    them (None: they are, or the wait was not needed): the positions stood still, or a
    checkpoint restored under this worker put its own parts back. The job has then not
    ended with its data, and once the session has ended (the chief's final checkpoint
    saved) `check_trained` says so with 138: a restart resumes and trains them. An exit
    0 would tell an orchestrator the job is done. A ps lost during the wait ends it at
    once with 138 (nothing can be saved without it).
    """

    def __init__(self, positions: WorkerPositions, left: Callable[[list[int]], list[int]],
                 stopped: Callable[[], bool], wait_secs: float, write: Callable[[str], None],
                 on_wait: Callable[[], None] = lambda: None):
        self._positions, self._left, self._stopped = positions, left, stopped
        self._wait_secs, self._write, self._on_wait = wait_secs, write, on_wait
        self.untrained: str | None = None

    def end(self, session) -> None:
        # A stop first: no wait then, and no read of a ps that may have gone with it (the
        # soak, async seed 721: SIGTERM to the workers as ps 0 was killed).
        if self._stopped():
            return
        now = self._read(session)
        left = self._left(now)
        if left[self._positions.rank]:
            return
        if sum(left):
            self._on_wait()
            self._write(f"{sum(left)} part(s) of the data's passes left to the other "
                        "workers: waiting for them")
        self.untrained = self._wait(session, now, left)

    def _read(self, session) -> list[int]:
        try:
            return self._positions.read(session)
        except tf.errors.OpError:  # the ps holding them has gone, or restarted
            raise PeerUnavailable(
                "data.epochs: the ps holding the workers' positions was lost as this worker "
                "ended; nothing can be saved without it. Restart the job's tasks: training "
                "resumes from the last checkpoint and trains what it has not") from None

    def _wait(self, session, now: list[int], left: list[int]) -> str | None:
        moved = time.monotonic()
        while sum(left) and not self._stopped():
            if time.monotonic() - moved > self._wait_secs:
                self._write(f"the workers' positions stood still for {self._wait_secs:g} s "
                            f"with {sum(left)} part(s) left: saving without them "
                            "(a resume trains them)")
                return (f"{sum(left)} part(s) of the data's passes were not trained: the "
                        f"workers' positions stood still for {self._wait_secs:g} s")
            time.sleep(POLL_SECS)
            before, now = now, self._read(session)
            left = self._left(now)
            if left[self._positions.rank]:
                return ("a checkpoint restored under this worker put back parts of its own "
                        "to train again")
            if now != before:
                moved = time.monotonic()
        return None

    def check_trained(self) -> None:
        """Raise PeerUnavailable (exit status 138) if the wait ended with parts of the
        data's passes untrained."""
        if self.untrained:
            raise PeerUnavailable(f"data.epochs: {self.untrained}. Restart the job's tasks: "
                                  "training resumes from the last checkpoint and trains them")
