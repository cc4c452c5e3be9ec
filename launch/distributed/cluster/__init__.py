"""Who is who in a cluster: where its description comes from, and this process's task.

A cluster (its jobs' addresses) and this process's task can be given in several places;
each is a resolver module, and ``RESOLVERS`` lists them. Any may be used, several at once
if they agree; disagreement is an error naming the places.

    job_file      the job file's ``cluster`` section
    command_line  --ps-hosts, --worker-hosts, --job-name, --task-index
    tf_config     the TF_CONFIG variable that Kubeflow's TFJob sets
    slurm         the Slurm step this process is a task of (srun's variables)
    indexed_job   the Kubernetes Indexed Job this process is a pod of

The last two are launchers: they started every task and tell each its place, so every
task runs one command, `towers train`, and is the ps or worker task it is told; outside
a launcher `towers train` is one process.

``resolving`` says what a resolver gives and how the task is worked out from all of
them; ``task`` is the ``Task`` found; ``peers`` waits for the other tasks, ``server`` is
the gRPC server a ps or worker task runs (it imports TensorFlow; the rest does not, so
a cluster is worked out before TensorFlow starts).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from launch.config import ClusterConfig
from launch.distributed.cluster.command_line import CommandLine
from launch.distributed.cluster.indexed_job import IndexedJob
from launch.distributed.cluster.job_file import JobFile
from launch.distributed.cluster.resolving import Flags, Given, Resolver, task_from
from launch.distributed.cluster.slurm import Slurm
from launch.distributed.cluster.task import ClusterError, Task
from launch.distributed.cluster.tf_config import TfConfig

# Every place a cluster may come from, in the order messages name them.
RESOLVERS: tuple[Resolver, ...] = (JobFile(), CommandLine(), TfConfig(), Slurm(), IndexedJob())


def resolve(cfg: ClusterConfig, flags: Flags, command: str,
            environ: Mapping[str, str] = os.environ) -> Task | None:
    """This process's Task for `towers ps|worker|evaluator|train`; ClusterError if unclear.

    command: "ps", "worker" (which also serves as "chief"), "evaluator", or "train",
    which is a task only under a launcher (None otherwise: one process) and then the
    task the launcher makes it.
    """
    given = Given(cfg, flags, environ)
    if command == "train" and not any(r.read(given).cluster for r in RESOLVERS if r.launcher):
        return None
    return task_from({r: r.read(given) for r in RESOLVERS}, command)


__all__ = ["RESOLVERS", "ClusterError", "Flags", "Resolver", "Task", "resolve"]
