"""A bound on every training step of a ps/worker worker, so a peer that stopped answering
ends the step (and the worker, with status 138) instead of hanging it."""

from __future__ import annotations

import tensorflow as tf

from launch.config import ClusterConfig
from launch.distributed.cluster import Task
from launch.distributed.health.liveness import not_answering

V1 = tf.compat.v1


class StepDeadline(V1.train.SessionRunHook):
    """Bounds every training step, so a peer that stopped answering ends the step with
    DeadlineExceededError instead of a hang. A session's first step may wait up to
    cluster.startup_timeout_secs: in a synchronous job it waits for every worker to
    start, which can take longer than any later step should. Later steps wait up to
    cluster.operation_timeout_secs.

    current: (seconds, cluster key) of the step running or last run.
    """

    def __init__(self, cfg: ClusterConfig):
        self._first = (cfg.startup_timeout_secs, "startup_timeout_secs")
        self._later = (cfg.operation_timeout_secs, "operation_timeout_secs")
        self.current = self._first
        self._started = False

    def after_create_session(self, session, coord) -> None:
        self._started = False  # MonitoredSession re-creates it after a lost ps

    def before_run(self, run_context):
        self.current = self._later if self._started else self._first
        options = V1.RunOptions(timeout_in_ms=int(self.current[0] * 1000))
        return V1.train.SessionRunArgs(None, options=options)

    def after_run(self, run_context, run_values) -> None:
        self._started = True


def stuck_step(task: Task, deadline: StepDeadline) -> str:
    """What to say when a step ran out of its deadline: the peers not answering now."""
    others = {
        f"{job} {i}": a
        for job in ("ps", "chief", "worker")
        for i, a in enumerate(task.cluster.get(job, ()))
        if (job, i) != (task.job_name, task.task_index)
    }
    silent = [f"{name} at {a}" for name, a in not_answering(others).items()]
    who = f"not answering: {', '.join(silent)}" if silent else "every peer answers"
    secs, key = deadline.current
    return (
        f"cluster: a step waited {secs:g} s (cluster.{key}) for its peers; {who}. "
        "Restart the job's tasks: training resumes from the last checkpoint"
    )
