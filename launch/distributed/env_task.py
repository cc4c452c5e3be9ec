"""A task's place in a cluster, as worked out from what its launcher put in its
environment (a Slurm step: slurm_env; a Kubernetes Indexed Job: indexed_job_env),
with no host list written by hand. Pure: no TensorFlow.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class EnvTask:
    """cluster: job name ("worker", "ps") -> "host:port" of each of its tasks, in index
    order. cuda_visible_devices: what CUDA_VISIBLE_DEVICES must be before TensorFlow
    starts; None leaves it as it is.
    """

    cluster: Mapping[str, tuple[str, ...]]
    job_name: str
    task_index: int
    cuda_visible_devices: str | None = None

    def tf_config(self) -> dict:
        """The cluster as TF_CONFIG: {"cluster": {...}, "task": {"type", "index"}}."""
        return {"cluster": {job: list(hosts) for job, hosts in self.cluster.items()},
                "task": {"type": self.job_name, "index": self.task_index}}
