"""`towers ps`: serve a ps/worker job's variables until every worker has reported finished."""

from __future__ import annotations

import time
from collections.abc import Callable

import tensorflow as tf

from launch import metrics
from launch.config import JobConfig
from launch.distributed.arrangements.ps_worker.plan import worker_plan
from launch.distributed.cluster import Task
from launch.distributed.cluster.server import start_server
from launch.distributed.health.ending import finished_queue, read_report
from launch.distributed.health.liveness import Liveness, ps_rule
from launch.log import log
from launch.runtime.signals import StopSignals, ignore_from_now
from launch.runtime.training_graph import build_training_graph

V1 = tf.compat.v1


def run_ps(job: JobConfig, task: Task, write: Callable[[str], None] = log) -> dict:
    """Serve variables until every worker has reported finished (or the grace runs out)."""
    identity = metrics.Identity(task.job_name, task.task_index, job.run.name)
    with metrics.serve(job.metrics, identity, write) as exporter:
        if exporter is not None:
            exporter.gauge(
                "towers_ps_variable_bytes", "Bytes of variables (and optimizer slots) on this ps"
            ).set(hosted_bytes(job, task))
        return _run_ps(job, task, write)


def hosted_bytes(job: JobConfig, task: Task) -> int:
    """Bytes of variables the workers place on this ps task.

    The ps never builds the model, so it builds the chief's graph once, aside,
    and reads the placement: the greedy balancer is deterministic, so this is the
    placement the workers make.
    """
    chief = Task(task.cluster, "chief" if "chief" in task.cluster else "worker", 0)
    graph = tf.Graph()
    with graph.as_default():
        build_training_graph(job, worker_plan(job, chief))
        held = 0
        for var in V1.global_variables():
            spec = tf.DeviceSpec.from_string(var.device)
            if spec.job == "ps" and spec.task == task.task_index:
                held += var.shape.num_elements() * var.dtype.size
    return held


STOP_WAIT_SECS = 15.0  # after SIGTERM: how long to serve workers still finishing


def _run_ps(job: JobConfig, task: Task, write: Callable[[str], None]) -> dict:
    """Serve until every worker has reported finished, or the end rules below say stop.

    Stopped by a signal (Kubernetes deleting the job's pods signals them all at once),
    a ps keeps serving the workers that still answer, at most STOP_WAIT_SECS (or the
    shutdown grace if shorter): the chief's final checkpoint reads every variable
    from the ps tasks, so a ps that left at once would lose it.
    """
    # Stop signals are caught from before the server starts: workers may be up (and be
    # signalled with it) while this task is still starting.
    with StopSignals() as stop:
        reported = _serve(job, task, stop, write)
    # Done serving: local-cluster forwards a stop once the workers are gone, which can
    # arrive while this task is already shutting down.
    ignore_from_now()
    write("job finished; shutting down" if not stop else "stopped on signal")
    record = {"job": "ps", "task": task.task_index, "workers_reported": reported}
    return {**record, "stopped_by": "signal"} if stop else record


def _serve(job: JobConfig, task: Task, stop: StopSignals, write: Callable[[str], None]) -> int:
    """Serve the workers until all have reported finished or the end rules say stop;
    return how many reported."""
    config = V1.ConfigProto(device_filters=[task.device])
    server = start_server(task, config, write)
    graph = tf.Graph()
    with graph.as_default():
        dequeue = finished_queue(task.task_index).dequeue()
    reported: set[int] = set()
    first_report = None
    diverged = False
    poll = V1.RunOptions(timeout_in_ms=500)
    workers = Liveness(_workers_by_rank(task), ps_rule(job.cluster), write)
    ending = _Ending(job.cluster, workers, write)
    with V1.Session(server.target, graph=graph, config=config) as sess:
        while len(reported) < task.num_workers:
            try:
                rank, told_diverged = read_report(int(sess.run(dequeue, options=poll)))
                reported.add(rank)
                diverged = diverged or told_diverged
                first_report = first_report or time.monotonic()
            except tf.errors.DeadlineExceededError:
                if not diverged:  # then bounded by the wait for workers still starting
                    workers.check()
            missing = sorted(set(range(task.num_workers)) - reported)
            if missing and ending.should_end(missing, first_report, stop.received, diverged):
                break
    return len(reported)


class _Ending:
    """When a ps stops waiting for workers that have not reported finished."""

    def __init__(self, cfg, workers: Liveness, write: Callable[[str], None]) -> None:
        self._cfg = cfg
        self._workers = workers
        self._write = write
        self._stop_since: float | None = None

    def should_end(self, missing: list[int], first_report: float | None,
                   signal_name: str | None, diverged: bool = False) -> bool:
        now = time.monotonic()
        if signal_name is not None:
            if self._stop_since is None:
                self._stop_since = now
                self._write(f"received {signal_name}: serving workers {missing} until they "
                            f"finish, at most {self._stop_wait():g} s")
            if now - self._stop_since > self._stop_wait():
                self._write(f"workers {missing} did not finish within {self._stop_wait():g} s")
                return True
            return not self._any_answers(missing)
        waited = now - first_report if first_report else 0.0
        if diverged:
            # A worker still starting (a restart, a slow host) learns why the job ended
            # only from the ps tasks: without them it would wait for them and end 138.
            if waited <= self._cfg.startup_timeout_secs:
                return False
            self._write(f"workers {missing} did not report within {waited:.0f} s of the "
                        "job's divergence (cluster.startup_timeout_secs); shutting down")
            return True
        if waited <= self._cfg.shutdown_grace_secs:
            return False
        # A worker that still answers may be re-creating its session after a lost ps
        # (up to 30 s in MonitoredSession); it will report when it sees the chief is
        # done. Only those that went silent are given up on.
        if waited > self._cfg.shutdown_grace_secs + self._cfg.reconnect_timeout_secs or (
            not self._any_answers(missing)
        ):
            self._write(f"workers {missing} did not report within {waited:.0f} s; shutting down")
            return True
        return False

    def _stop_wait(self) -> float:
        return min(STOP_WAIT_SECS, self._cfg.shutdown_grace_secs)

    def _any_answers(self, missing: list[int]) -> bool:
        names = list(self._workers.peers)
        return self._workers.any_answers(names[rank] for rank in missing)


def _workers_by_rank(task: Task) -> dict[str, str]:
    """Name -> address of every worker, in worker-rank order: the chief (if any) first."""
    return {f"{job} {i}": a for job in ("chief", "worker")
            for i, a in enumerate(task.cluster.get(job, ()))}
