"""A non-chief worker's start: wait until the chief has initialised (or restored) the
variables every worker trains."""

from __future__ import annotations

import time

import tensorflow as tf

from launch.errors import PeerUnavailable

V1 = tf.compat.v1


def wait_for_chief(master: str, config: V1.ConfigProto, timeout: float) -> None:
    """Poll every half second until the chief has initialised the variables.

    MonitoredTrainingSession's own wait re-checks only every 30 s, which would idle
    every non-chief worker for that long at each start. A ps lost meanwhile fails a
    poll: the next one opens a new session, as MonitoredSession's recovery does, so a
    restarted ps is waited for (one gone for good ends the process through the ps
    watch, ps_worker.worker._watching_ps) within the same timeout.
    """
    # Global variables only: local ones (the loss scale, this worker's own step) are
    # each worker's own to initialise.
    uninitialized = V1.report_uninitialized_variables(V1.global_variables())
    deadline = time.monotonic() + timeout
    sess, failed = None, None
    try:
        while True:
            try:
                sess = sess or V1.Session(master, config=config)
                if not len(sess.run(uninitialized)):
                    return
            except tf.errors.OpError as err:  # a ps lost or restarting: a session anew
                if sess is not None:
                    sess.close()
                sess, failed = None, err
            if time.monotonic() > deadline:
                raise PeerUnavailable(_not_initialised(timeout, failed))
            time.sleep(0.5)
    finally:
        if sess is not None:
            sess.close()


def _not_initialised(timeout: float, failed: tf.errors.OpError | None) -> str:
    why = "" if failed is None else failed.message.strip().partition("\n")[0]
    return (f"cluster: the chief did not initialise the variables within {timeout:g} s"
            + (f" (the last poll: {why})" if why else ""))
