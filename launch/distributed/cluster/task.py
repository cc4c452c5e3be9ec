"""Who is who in a cluster: this process's task (its job, index and peers) and the error of
a cluster that cannot be worked out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from launch.errors import BadInput

SERVER_JOBS = ("chief", "worker", "ps")  # the jobs that run a tf.distribute.Server
ALL_JOBS = (*SERVER_JOBS, "evaluator")


class ClusterError(BadInput):
    """The cluster cannot be worked out from what was given (bad input)."""


@dataclass(frozen=True)
class Task:
    """This process's place in the cluster.

    cluster: job name -> addresses, for the jobs that run servers (chief, worker, ps).
    gpus: what CUDA_VISIBLE_DEVICES must be before TensorFlow starts ("" for none), where
    the cluster's launcher shares a node's GPUs among its tasks; None leaves it alone.
    """

    cluster: Mapping[str, tuple[str, ...]]
    job_name: str
    task_index: int
    gpus: str | None = None

    @property
    def is_chief(self) -> bool:
        """The chief initialises, checkpoints and writes summaries: the chief task if
        the cluster has one, else worker 0."""
        return self.job_name == self.chief_job and self.task_index == 0

    @property
    def num_workers(self) -> int:
        """Tasks that train: the chief (if any) and the workers."""
        return len(self.cluster.get("chief", ())) + len(self.cluster.get("worker", ()))

    @property
    def worker_rank(self) -> int:
        """0 .. num_workers-1, chief first: which share of each global batch this task reads."""
        if self.job_name == "chief":
            return 0
        return self.task_index + len(self.cluster.get("chief", ()))

    @property
    def share(self) -> tuple[int, int]:
        """(worker_rank, num_workers): this task's part of every global batch and of the
        data (launch.runtime.plan.Share); the ps and evaluator tasks read none."""
        return self.worker_rank, self.num_workers

    @property
    def device(self) -> str:
        return f"/job:{self.job_name}/task:{self.task_index}"

    @property
    def chief_job(self) -> str:
        """The chief's job: 'chief' if the cluster has one, else 'worker' (its task 0)."""
        return "chief" if "chief" in self.cluster else "worker"

    @property
    def chief_device(self) -> str:
        return f"/job:{self.chief_job}/task:0"

    @property
    def label(self) -> str:
        """'worker1', 'chief0': this task in the names of the files it writes (as
        local-cluster names its tasks)."""
        return f"{self.job_name}{self.task_index}"

    @property
    def address(self) -> str:
        return self.cluster[self.job_name][self.task_index]

    def cluster_spec(self):
        import tensorflow as tf

        return tf.train.ClusterSpec({job: list(hosts) for job, hosts in self.cluster.items()})

    def peers(self) -> dict[str, str]:
        """Tasks this one must reach before training: every ps, and the chief for others."""
        needed = {f"ps {i}": a for i, a in enumerate(self.cluster.get("ps", ()))}
        if not self.is_chief and self.job_name != "ps":
            needed[f"{self.chief_job} 0"] = self.cluster[self.chief_job][0]
        return needed
