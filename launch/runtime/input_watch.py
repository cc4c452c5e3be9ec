"""Whether a stuck step still waits for its input: the batches this process's steps
have taken from their input, counted in the graph as each arrives, against the steps
finished. A step that has taken no more batches than steps finished has not got its
batch (an empty or stuck input pipeline); one that has is past its input (its devices,
or its peers). The count is a local variable on the process's host, bumped beside the
towers' compute (nothing waits for it), and read from the stall watch's thread while the
step is stuck (launch/runtime/stall.py)."""

from __future__ import annotations

import tensorflow as tf

V1 = tf.compat.v1

COLLECTION = "towers_batches_taken"
READ_TIMEOUT_MS = 2000


def count_batches(features: tf.Tensor, device: str) -> tf.Operation:
    """The op that adds one to the count once `features` (a step's batch) has arrived;
    run it with every step."""
    with tf.device(device), tf.name_scope("towers_input_watch"):
        taken = V1.Variable(0, dtype=tf.int64, trainable=False, use_resource=True,
                            collections=[V1.GraphKeys.LOCAL_VARIABLES, COLLECTION],
                            name="batches_taken")
        with tf.control_dependencies([features.op]):
            return taken.assign_add(1).op


def batches_taken(graph: tf.Graph) -> tf.Tensor | None:
    """The count's value in `graph` (None: the graph counts none)."""
    found = graph.get_collection(COLLECTION)
    return found[0].read_value() if found else None


def waits_for_input(session, taken: tf.Tensor, steps_finished: int) -> bool | None:
    """Whether the running step has not got its batch (None: the count cannot be read)."""
    try:
        count = session.run(taken, options=V1.RunOptions(timeout_in_ms=READ_TIMEOUT_MS))
    except (tf.errors.OpError, RuntimeError):
        return None
    return count <= steps_finished
