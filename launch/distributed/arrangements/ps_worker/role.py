"""What the training loop asks of a ps/worker worker (launch.runtime.role.Role)."""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

import towers
from launch import metrics
from launch.config import JobConfig
from launch.distributed.arrangements.ps_worker import sync_replicas
from launch.distributed.arrangements.ps_worker.chief_wait import (
    Chief,
    ChiefStarted,
    wait_for_chief,
)
from launch.distributed.cluster import Task
from launch.distributed.health.ending import (
    JobEndHook,
    final_step,
    report_finished,
    stop_queue,
    tell_diverged,
    tell_final_step,
)
from launch.distributed.health.peer_reports import PeerReportHook, PeerReports, stall_cause
from launch.distributed.health.step_deadline import StepDeadline
from launch.distributed.health.stragglers import StragglerWatch
from launch.log import log
from launch.runtime.role import Role
from launch.runtime.signals import StopSignals

V1 = tf.compat.v1


class WorkerRole(Role):
    """A worker of a ps/worker job: its server's session, chief or not, synchronous or not.

    The sync chief's queue-runner thread may be blocked for good on gradients
    from workers that have already stopped, so closing waits only briefly for it:
    by then the final checkpoint is written.
    deadline: the StepDeadline hook bounding every step.
    """

    def __init__(self, job: JobConfig, task: Task, server, write: Callable[[str], None] = log,
                 exporter: metrics.Exporter | None = None):
        super().__init__(
            master=server.target,
            is_chief=task.is_chief,
            writes=task.is_chief,
            max_wait_secs=job.cluster.startup_timeout_secs,
            stop_grace_secs=1.0,
        )
        self.label = task.label
        self._job, self._task = job, task
        self._write = write
        self._sync: sync_replicas.SyncReplicas | None = None
        self._end: JobEndHook | None = None
        self._exporter = exporter
        self._reports: PeerReportHook | None = None
        self._stragglers: StragglerWatch | None = None
        self._stop: StopSignals | None = None
        self.deadline = StepDeadline(job.cluster)

    def wrap_optimizer(self, optimizer: V1.train.Optimizer) -> V1.train.Optimizer:
        if not self._job.train.sync:
            return optimizer
        self._sync = sync_replicas.wrap(optimizer, self._task, self._job.train.backup_workers,
                                        self._job.train.batch_size)
        return self._sync

    def hooks(self, ops: towers.TrainOps, data_end, phases=None,
              follow=None) -> list[V1.train.SessionRunHook]:
        release = None
        if self._sync is not None:
            release = self._sync.get_init_tokens_op(num_tokens=self._task.num_workers)
        self._end = JobEndHook(self._task, release, data_end, self._write)
        reporting = [] if phases is None else [self._peer_reports(phases)]
        if self._sync is None:
            return [self._end, self.deadline, *reporting]
        sync = sync_replicas.session_hook(self._sync, self._task.is_chief,
                                          self._task.num_workers)
        started = [ChiefStarted(self._chief())] if self.is_chief else []
        turns = [] if follow is None else [sync_replicas.OneTokenPerRound(
            self._sync, ops.global_step, stop_queue().size(), follow,
            (self._job.cluster.startup_timeout_secs, self._job.cluster.operation_timeout_secs),
            lambda: bool(self._stop))]
        return [self._end, sync, *started, *turns, self.deadline, *reporting]

    def _peer_reports(self, phases) -> PeerReportHook:
        """This worker's report to the others; the chief also names stragglers."""
        stragglers = StragglerWatch.for_job(self._job.train, self._write, self._exporter) \
            if self.is_chief else None
        self._reports = PeerReportHook(PeerReports(self._task), stragglers)
        self._stragglers = stragglers
        phases.listen(self._reports.times.on_phases)
        return self._reports

    def stragglers(self) -> list[str]:
        return self._stragglers.named if self._stragglers is not None else []

    def stall_cause(self) -> str:
        """Which workers stopped reporting, or that ps 0 does not answer."""
        if self._reports is None or self._reports.session is None:
            return "the session is not running yet"
        return stall_cause(self._reports.reports, self._reports.session, self._job.train.sync)

    def before_session(self, config: V1.ConfigProto) -> None:
        if self.is_chief:
            self._end.clear(self.master, config)
            if self._sync is not None:
                self._sync.clear(self.master, config)
        else:
            chief = None if self._sync is None else self._chief()
            wait_for_chief(self.master, config, self.max_wait_secs, self._write, chief)

    def _chief(self) -> Chief:
        task = self._task
        return Chief(task.cluster[task.chief_job][0], task.chief_device)

    def stop_hook(self, stop: StopSignals) -> V1.train.SessionRunHook:
        self._stop = stop  # asked for before hooks(): a stop ends a wait for a token too
        return super().stop_hook(stop)

    def unblock_op(self) -> tf.Operation | None:
        """One token, for this worker's own blocked step (see StopOnSignalHook)."""
        return None if self._sync is None else self._sync.get_init_tokens_op(num_tokens=1)

    def finish(self, result: dict) -> dict:
        """The job's last step in every worker's result (the chief's final checkpoint's),
        then this worker's report to the ps tasks. A worker stopped by its own signal
        does not wait for the chief's: the job may go on without it (a node preempted),
        and its stop would wait cluster.shutdown_grace_secs for nothing."""
        if self.is_chief:
            tell_final_step(self._task, result["global_step"])
        elif result.get("stopped_by") != "signal":
            result = {**result, "global_step": self._final_step(result["global_step"])}
        report_finished(self._task, self._write)
        return {**result, "job": self._task.job_name, "task": self._task.task_index}

    def _final_step(self, seen: int) -> int:
        wait = self._job.cluster.shutdown_grace_secs
        step = final_step(self._task, wait)
        if step is None:
            self._write(f"the chief's final step did not come within {wait:g} s "
                        "(cluster.shutdown_grace_secs); the result's global_step is the last "
                        f"this worker saw, {seen}")
            return seen
        return step

    def diverged(self) -> None:
        """This worker's session ended on a non-finite step, its own or another's: make
        sure every worker stops, and tell the ps tasks this one is done."""
        if self._end is not None and self._end.peer_diverged is None:
            tell_diverged(self._task)
            if self._sync is not None:
                sync_replicas.wake_workers(self._task, self._sync.token_ps())
        report_finished(self._task, self._write, diverged=True)
