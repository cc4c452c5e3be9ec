"""Which arrangement a command runs its job under (launch.config.arrangements), and the
command's task in a cluster (launch.distributed.cluster): worked out as the job loads,
before TensorFlow starts, and kept on the parsed arguments for the command's handler."""

from __future__ import annotations

import os

from launch.log import log

# The commands that run a job's processes under an arrangement (launch.config.arrangements);
# the others (eval, export, ...) take the job as its cluster.backend names it.
ARRANGED = ("train", "ps", "worker", "local-cluster", "validate")
# The commands whose process may be a task of a cluster: `towers train` only under a
# launcher (a Slurm step, an Indexed Job), as the task the launcher makes it.
TASKS = ("train", "ps", "worker")


def choose(args, job) -> str:
    """The arrangement this command runs the job under: cluster.backend's, or for auto the
    command's choice from the cluster (a task's from the one it resolves, local-cluster's
    from --ps, validate's from the job file's cluster section). The job is checked
    against it as it loads. Kept, with the task, on args for the command's handler."""
    from launch import config

    if args.command not in ARRANGED:
        return job.cluster.backend
    if args.command in TASKS:
        args.task = task(args, job)
        cluster = args.task.cluster if args.task else ()
    elif args.command == "local-cluster":
        cluster = ("ps", "worker") if args.ps else ("worker",)
    else:
        cluster = tuple(name for name in ("ps", "worker", "chief") if getattr(job.cluster, name))
    command = None if args.command == "validate" else args.command
    args.arrangement = config.choose(job.cluster.backend, command, cluster)
    return args.arrangement


def task(args, job):
    """This process's place in the cluster (launch.distributed.cluster); None for
    `towers train` outside a launcher or with cluster.backend in_process (one process).
    Where the launcher shares a node's GPUs among its tasks, this task's share is made
    CUDA_VISIBLE_DEVICES here, as the job loads, before TensorFlow starts."""
    from launch.config import train_is_task
    from launch.distributed import cluster

    if args.command == "train" and not train_is_task(job.cluster.backend):
        return None
    flags = cluster.Flags(*(getattr(args, name, None) for name in
                            ("ps_hosts", "worker_hosts", "job_name", "task_index")))
    place = cluster.resolve(job.cluster, flags, args.command)
    if place is not None and place.gpus is not None:
        share = "its share" if place.gpus else "none"
        log(f'{place.job_name} {place.task_index}: CUDA_VISIBLE_DEVICES="{place.gpus}", '
            f"{share} of the node's GPUs {os.environ.get('CUDA_VISIBLE_DEVICES', '')}")
        os.environ["CUDA_VISIBLE_DEVICES"] = place.gpus
    return place
