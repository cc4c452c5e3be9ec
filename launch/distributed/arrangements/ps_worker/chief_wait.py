"""A non-chief worker's start: wait until the chief has initialised (or restored) the
variables every worker trains and, in a synchronous job, started its session.

A synchronous job's workers also wait for the chief's own word that its session of
this run has started (ChiefStarted). A ps outlives the chief, so its variables say
nothing of the chief's run: a worker started beside a chief started again had sent its
first gradient before that chief's start took what the ps's accumulators held
(SyncReplicas.clear), then waited for an update that needed that gradient, and so did
the chief, until cluster.startup_timeout_secs ended the worker (138). The word is a
flag in the chief's process, set once its session has started: a chief started again
has not set it yet, whatever the ps holds.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import tensorflow as tf

from launch.distributed.health import ending
from launch.errors import PeerUnavailable

V1 = tf.compat.v1

POLL_TIMEOUT_MS = 5_000  # a poll the chief does not answer (frozen, still starting)
STARTED_FLAG = "towers_chief_started"


class Chief:
    """Where the chief's flag lives: its server's address and its task's device."""

    def __init__(self, address: str, device: str):
        self.address, self.device = address, device
        self.graph = tf.Graph()
        with self.graph.as_default(), tf.device(device):
            flag = V1.Variable(True, trainable=False, name=STARTED_FLAG)
            self.set_started = flag.initializer
            self.started = V1.is_variable_initialized(flag)

    def run(self, fetch):
        """`fetch` through the chief's own server, bounded: the workers' sessions see
        only the ps tasks and themselves."""
        return ending.run_on_task("the chief", self.address, self.device, self.graph, fetch,
                                  POLL_TIMEOUT_MS)


class ChiefStarted(V1.train.SessionRunHook):
    """The chief, once its session has started: sets the flag the workers wait for.
    After the synchronous optimizer's own hook (its accumulators at the restored step,
    the other workers' tokens handed out)."""

    def __init__(self, chief: Chief):
        self._chief = chief

    def after_create_session(self, session, coord) -> None:
        self._chief.run(self._chief.set_started)


def wait_for_chief(master: str, config: V1.ConfigProto, timeout: float,
                   write: Callable[[str], None], chief: Chief | None = None) -> None:
    """Poll every half second until the chief has initialised the variables and, where
    `chief` is given (a synchronous job), has started its session of this run.

    MonitoredTrainingSession's own wait re-checks only every 30 s, which would idle
    every non-chief worker for that long at each start. A ps lost meanwhile fails a
    poll: the next one opens a new session, as MonitoredSession's recovery does, so a
    restarted ps is waited for (one gone for good ends the process through the ps
    watch, ps_worker.worker._watching_ps) within the same timeout. So is a chief that
    does not answer a poll within POLL_TIMEOUT_MS.
    """
    # Global variables only: local ones (the loss scale, this worker's own step) are
    # each worker's own to initialise.
    uninitialized = V1.report_uninitialized_variables(V1.global_variables())
    deadline = time.monotonic() + timeout
    sess, failed, announced = None, None, False
    try:
        while True:
            try:
                sess = sess or V1.Session(master, config=config)
                if not len(sess.run(uninitialized, options=_bounded())) and (
                        chief is None or chief.run(chief.started)):
                    return
            except tf.errors.OpError as err:  # a ps lost or restarting: a session anew
                if sess is not None:
                    sess.close()
                sess, failed = None, err
            if time.monotonic() > deadline:
                raise PeerUnavailable(_not_initialised(timeout, failed))
            if not announced:
                write("waiting for the chief to initialise or restore the variables and "
                      "start its session")
                announced = True
            time.sleep(0.5)
    finally:
        if sess is not None:
            sess.close()


def _bounded() -> V1.RunOptions:
    return V1.RunOptions(timeout_in_ms=POLL_TIMEOUT_MS)


def _not_initialised(timeout: float, failed: tf.errors.OpError | None) -> str:
    why = "" if failed is None else failed.message.strip().partition("\n")[0]
    return (f"cluster: the chief did not initialise or restore the variables and start its "
            f"session within {timeout:g} s (cluster.startup_timeout_secs)"
            + (f" (the last poll: {why})" if why else ""))
