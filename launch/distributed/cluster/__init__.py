"""Who is who in a cluster: where its description comes from, and this process's task.

A cluster (its jobs' addresses) and this process's task can be given in several places;
each is a resolver module, and ``RESOLVERS`` lists them. Any may be used, several at once
if they agree; disagreement is an error naming the places.

    job_file      the job file's ``cluster`` section
    command_line  --ps-hosts, --worker-hosts, --job-name, --task-index
    tf_config     the TF_CONFIG variable that Kubeflow's TFJob sets

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
from launch.distributed.cluster.job_file import JobFile
from launch.distributed.cluster.resolving import Flags, Given, Resolver, task_from
from launch.distributed.cluster.task import ClusterError, Task
from launch.distributed.cluster.tf_config import TfConfig

# Every place a cluster may come from, in the order messages name them.
RESOLVERS: tuple[Resolver, ...] = (JobFile(), CommandLine(), TfConfig())


def resolve(cfg: ClusterConfig, flags: Flags, command: str,
            environ: Mapping[str, str] = os.environ) -> Task:
    """This process's Task for `towers ps|worker|evaluator`; ClusterError if unclear.

    command: "ps", "worker" (which also serves as "chief") or "evaluator".
    """
    given = Given(cfg, flags, environ)
    return task_from({r: r.read(given) for r in RESOLVERS}, command)


__all__ = ["RESOLVERS", "ClusterError", "Flags", "Resolver", "Task", "resolve"]
