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
