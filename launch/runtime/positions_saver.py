"""The Saver of an asynchronous ps/worker job: it saves a copy of the workers' positions
taken before the save reads any variable, and restores the positions from any checkpoint
(launch/runtime/worker_positions.py says why)."""

from __future__ import annotations

import tensorflow as tf

from launch.data.position import resumed_positions
from launch.runtime.checkpoints import DATA_SCOPE
from launch.runtime.data_state import FIELDS, DataState, Stored
from launch.runtime.worker_positions import WorkerPositions

V1 = tf.compat.v1

SAVED_NAME = f"{DATA_SCOPE}/worker_positions"


def positions_saver(positions: WorkerPositions, state: DataState, global_step: tf.Variable,
                    **kwargs) -> V1.train.Saver:
    """The job's Saver (``kwargs``: V1.train.Saver's): every saveable but the live
    positions; before each save, the copy (which also moves the data state's base to the
    lowest position at the global step); each restore sets the live positions from the
    checkpoint's (``resumed_positions``: the same number of workers, each its own; else
    every worker at the lowest, or at the data position of a checkpoint without them)."""
    return _PositionsSaver(positions, state, global_step, **kwargs)


class _PositionsSaver(V1.train.Saver):
    def __init__(self, positions: WorkerPositions, state: DataState, global_step, **kwargs):
        saveables = [v for v in V1.global_variables() + V1.get_collection(
            V1.GraphKeys.SAVEABLE_OBJECTS) if v is not positions.live]
        super().__init__(var_list=saveables, **kwargs)
        self._without_positions = V1.train.Saver(
            var_list=[v for v in saveables if v is not positions.saved])
        self._positions = positions
        now = positions.live.read_value()
        base = state.variables
        self._copy = tf.group(positions.saved.assign(now),
                              base["base_step"].assign(tf.cast(global_step, tf.int64)),
                              base["base_position"].assign(tf.reduce_min(now)))

    def save(self, sess, save_path, global_step=None, *args, **kwargs):
        sess.run(self._copy)
        return super().save(sess, save_path, global_step, *args, **kwargs)

    def restore(self, sess, save_path):
        positions = self._positions
        reader = tf.train.load_checkpoint(save_path)
        saved = reader.get_tensor(SAVED_NAME).tolist() if reader.has_tensor(SAVED_NAME) \
            else None
        if saved is not None and len(saved) == positions.workers:
            super().restore(sess, save_path)
            positions.take_saved(sess)
            positions.restored = None
            return
        self._without_positions.restore(sess, save_path)
        stored = Stored.of({f: reader.get_tensor(f"{DATA_SCOPE}/{f}") for f in FIELDS})
        at = stored.progress.position(int(reader.get_tensor("global_step")))
        positions.set(sess, resumed_positions(saved, at, positions.workers))
        positions.restored = saved
