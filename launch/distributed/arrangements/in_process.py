"""``cluster.backend: in_process``, `towers train` alone: one process, its towers on this
host's devices; the in-process job every other arrangement spreads over processes."""

from __future__ import annotations

from collections.abc import Callable

from launch import metrics
from launch.config import JobConfig
from launch.config.arrangements import InProcessRules
from launch.distributed.cluster import Task
from launch.log import log
from launch.runtime.train import train


class InProcess(InProcessRules):
    """One process: the training loop as launch.runtime.train runs it."""

    def run(self, job: JobConfig, task: Task | None = None,
            write: Callable[[str], None] = log) -> dict:
        with metrics.serve(job.metrics, metrics.Identity("train", 0, job.run.name),
                           write) as exporter:
            return train(job, exporter=exporter, write=write)
