"""``cluster.backend: ps_worker``: ps tasks hold the variables, workers train on them.

    towers local-cluster --ps 1 --workers 2
    towers ps     -c job.yaml --ps-hosts h0:2222 --worker-hosts h1:2222,h2:2222 --task-index 0
    towers worker -c job.yaml --ps-hosts h0:2222 --worker-hosts h1:2222,h2:2222 --task-index 0

    plan           a worker's plan: its towers, variables on the ps tasks, its session
    worker         a worker task: server, peers, the training loop and its endings
    ps             a ps task: serve the variables until every worker has finished
    role           what the training loop asks of a worker (launch.runtime.role.Role)
    sync_replicas  train.sync's optimizer, its hook, the chief's quiet queue runner
    chief_wait     a non-chief worker's wait for the chief's variables
"""

from __future__ import annotations

from collections.abc import Callable

from launch.config import JobConfig
from launch.config.arrangements import PsWorkerRules
from launch.distributed.arrangements.ps_worker.ps import run_ps
from launch.distributed.arrangements.ps_worker.worker import run_worker
from launch.distributed.cluster import Task
from launch.log import log


class PsWorker(PsWorkerRules):
    """A ps/worker job: each task is a ps (serving) or a worker (training)."""

    def run(self, job: JobConfig, task: Task | None, write: Callable[[str], None] = log) -> dict:
        """This task's part: serve as a ps, or train as a worker; its final record."""
        if task.job_name == "ps":
            return run_ps(job, task, write)
        return run_worker(job, task, write)
