"""A stop that every process of a job takes after the same step (collective workers,
Horovod ranks): their steps wait for each other, so one that stopped alone would leave
the others waiting in a step it never takes."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

import tensorflow as tf

from launch.runtime.signals import StopSignals

V1 = tf.compat.v1


class StopVoteHook(V1.train.SessionRunHook):
    """A stop signal on any process stops every process after the same step.

    Each step sums every process's vote (1 once a stop signal arrived, else 0) across
    the job; all of them see the sum after that step and stop there. The writer's
    checkpoint hook then saves.
    sum_votes: the all-reduce sum of a float32 scalar across the job's processes.
    device: where the vote and its sum are placed (None: where the op lands).
    """

    def __init__(self, stop: StopSignals, sum_votes: Callable[[tf.Tensor], tf.Tensor],
                 device: str | None = None):
        self._stop, self._sum_votes, self._device = stop, sum_votes, device
        self._vote = self._job_votes = None

    def begin(self) -> None:
        place = tf.device(self._device) if self._device else nullcontext()
        with place, tf.name_scope("stop_vote"):
            self._vote = V1.placeholder_with_default(0.0, [], name="vote")
            self._job_votes = self._sum_votes(self._vote)

    def before_run(self, run_context):
        vote = 1.0 if self._stop else 0.0
        return V1.train.SessionRunArgs(self._job_votes, feed_dict={self._vote: vote})

    def after_run(self, run_context, run_values) -> None:
        if run_values.results > 0:
            # Stopped by another's signal, it is no finished process (soak collective
            # seed 419: the chief's result said nothing, and it was taken for done).
            self._stop.arrive_from_peer()
            run_context.request_stop()
