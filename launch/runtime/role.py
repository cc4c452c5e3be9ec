"""What kind of process runs the training loop: an in-process job, a ps/worker worker,
a Horovod rank. The loop asks its role; it never branches on which one it is."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import tensorflow as tf

import towers
from launch.runtime.hooks import DataEndHook, StopOnSignalHook
from launch.runtime.signals import StopSignals
from launch.runtime.step_phases import StepPhases

V1 = tf.compat.v1


@dataclass
class Role:
    """The in-process job; distributed variants subclass it and override what differs.

    master: the session target ("" for this process, else the worker's server).
    is_chief: initialises (or restores) the variables; the others wait for it, at
        most max_wait_secs.
    writes: writes checkpoints, summaries and the placement trace (a chief that
        is not a Horovod rank other than 0).
    stop_grace_secs: how long closing the session waits for its threads.
    label: this process in a job of several ('worker1', 'rank1'; '' alone), for the
        files each process writes (train.timeline).
    """

    master: str = ""
    is_chief: bool = True
    writes: bool = True
    max_wait_secs: float = 7200.0
    stop_grace_secs: float = 120.0
    label: str = ""

    def wrap_optimizer(self, optimizer: V1.train.Optimizer) -> V1.train.Optimizer:
        """The optimizer this role applies gradients with (e.g. SyncReplicasOptimizer)."""
        return optimizer

    def hooks(self, ops: towers.TrainOps, data_end: DataEndHook,
              phases: StepPhases | None = None,
              follow: Callable[[object, int], None] | None = None,
              ) -> list[V1.train.SessionRunHook]:
        """Extra hooks for this role's session, given the built training ops, the hook
        that knows whether the input ran out (it runs before these), the step phases (to
        listen to) and what starts the input at a global step's batch (follow(session,
        step), for a step this process takes out of turn)."""
        return []

    def start_hooks(self, ops: towers.TrainOps) -> list[V1.train.SessionRunHook]:
        """Hooks placed before every other one: their after_create_session runs first
        (a collective worker takes the chief's variables there, before any hook reads
        the global step)."""
        return []

    def stop_hook(self, stop: StopSignals) -> V1.train.SessionRunHook:
        """How a stop signal ends this process's training: after the current step (a
        collective job's workers agree on the step first)."""
        return StopOnSignalHook(stop, self.unblock_op())

    def stall_cause(self) -> str:
        """What a step that has not finished for train.stall_warning_secs, and has got
        its batch, waits for; asked from another thread while it waits."""
        return ("the step has its batch and no peers to wait for: it waits for its "
                "devices (the towers' compute, or a device that does not answer)")

    def before_session(self, config: V1.ConfigProto) -> None:
        """Runs once the graph is built, before the training session starts (a ps/worker
        chief clears the job's queues; the others wait for its variables)."""

    def unblock_op(self) -> tf.Operation | None:
        """An op that lets this process's step return when it waits for peers that have
        stopped (a synchronous worker's token), run only once a stop was requested and
        the step is still blocked. None: this role's steps never wait for peers."""
        return None

    def finish(self, result: dict) -> dict:
        """After the session has closed: report to peers, label the result."""
        return result

    def stragglers(self) -> list[str]:
        """The processes this one (a chief judging the others) named stragglers during
        the run, as its lines named them."""
        return []
