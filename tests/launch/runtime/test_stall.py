"""The stall watch: a step that has not finished for train.stall_warning_secs is named
with what it waits for, at doubling intervals; after stall_abort_secs the process is
ended with a retryable status (138); a step that then finishes says so."""

import threading

import tensorflow as tf

from launch.errors import EXIT_PEER_UNAVAILABLE, Stalled
from launch.runtime.stall import StallWatch

V1 = tf.compat.v1


def test_a_blocked_step_is_named_then_named_less_often_then_aborted():
    lines, aborted, feeders = [], [], []
    with tf.Graph().as_default():
        queue = tf.queue.FIFOQueue(1, tf.float32)  # an input that gives nothing: the step blocks
        step, feed = queue.dequeue(), queue.enqueue(1.0)
        sessions = _Sessions()

        def abort(error):  # instead of ending the process: record it, then let the step go
            if not aborted:
                aborted.append(error)
                feeders.append(threading.Thread(target=sessions.last.run, args=(feed,)))
                feeders[0].start()

        watch = StallWatch(0.4, 2.5, lambda: "the input gives nothing", lines.append, abort)
        with V1.train.MonitoredSession(hooks=[sessions, watch]) as session:
            session.run(step)  # returns once abort() has fed the queue
            feeders[0].join()
    warnings = [line for line in lines if line.startswith("no step has finished")]
    seconds = [int(line.split(" for ")[1].split(" s ")[0]) for line in warnings]
    assert warnings and all("(train.stall_warning_secs: 0.4): the input gives nothing" in line
                            for line in warnings)
    assert seconds == sorted(seconds) and len(warnings) <= 3  # 0.4, 0.8, 1.6: then abort
    error = aborted[0]
    assert isinstance(error, Stalled) and error.exit_status == EXIT_PEER_UNAVAILABLE
    assert str(error).startswith("train.stall_abort_secs: no step finished for ")
    assert "the input gives nothing" in str(error)
    assert lines[-1].startswith("steps go on again after ")


class _Sessions(V1.train.SessionRunHook):
    """Keeps the session, so another thread can run an op in it."""

    def after_create_session(self, session, coord):
        self.last = session
