"""The cluster of a Kubernetes Indexed Job (no Kubeflow), worked out by each pod from
its environment: a collective cluster of one worker per pod.

Kubernetes gives each pod of an Indexed Job its index (JOB_COMPLETION_INDEX, 0 ..
completions-1) and the hostname `<job name>-<index>`; a headless Service named as the
pods' `subdomain` gives each of them the DNS name `<job name>-<index>.<service>` in
the namespace. The manifest (docker/k8s/indexed-job.yaml) tells each pod the rest:

    TOWERS_K8S_JOB      the Job's name (from its label batch.kubernetes.io/job-name)
    TOWERS_K8S_SERVICE  the headless Service, the pods' subdomain
    TOWERS_K8S_WORKERS  the Job's completions: how many workers
    TOWERS_K8S_PORT     the cluster port every pod serves on (2222 if unset)

Worker i is the pod of index i at `<job>-<i>.<service>:<port>`; worker 0 is the chief.
Each pod has the GPUs its resources ask for, so CUDA_VISIBLE_DEVICES is left alone.
Pure: no TensorFlow, no network.
"""

from __future__ import annotations

from collections.abc import Mapping

from launch.distributed.env_task import EnvTask
from launch.errors import BadInput

INDEX = "JOB_COMPLETION_INDEX"
REQUIRED = (INDEX, "TOWERS_K8S_JOB", "TOWERS_K8S_SERVICE", "TOWERS_K8S_WORKERS")
DEFAULT_PORT = 2222


class IndexedJobError(BadInput):
    """The pod's environment does not describe an Indexed Job towers can form a cluster of."""


def in_indexed_job(environ: Mapping[str, str]) -> bool:
    """Whether this process runs in a pod of an Indexed Job set up for towers."""
    return INDEX in environ and "TOWERS_K8S_SERVICE" in environ


def indexed_job_task(environ: Mapping[str, str]) -> EnvTask:
    """This pod's place: worker JOB_COMPLETION_INDEX of TOWERS_K8S_WORKERS."""
    missing = [name for name in REQUIRED if not environ.get(name, "").strip()]
    if missing:
        raise IndexedJobError(
            f"kubernetes: {', '.join(missing)} not set: run towers in an Indexed Job whose "
            "pods set them, as docker/k8s/indexed-job.yaml does")
    index, workers = _number(environ, INDEX), _number(environ, "TOWERS_K8S_WORKERS")
    port = _number(environ, "TOWERS_K8S_PORT") if environ.get("TOWERS_K8S_PORT") else DEFAULT_PORT
    if not 0 <= index < workers:
        raise IndexedJobError(f"kubernetes: {INDEX}={index} is not below TOWERS_K8S_WORKERS="
                              f"{workers}; set TOWERS_K8S_WORKERS to the Job's completions")
    job, service = environ["TOWERS_K8S_JOB"].strip(), environ["TOWERS_K8S_SERVICE"].strip()
    workers_at = tuple(f"{job}-{i}.{service}:{port}" for i in range(workers))
    return EnvTask({"worker": workers_at}, "worker", index)


def _number(environ: Mapping[str, str], name: str) -> int:
    try:
        return int(environ[name])
    except ValueError:
        raise IndexedJobError(f"kubernetes: {name}={environ[name]!r} is not a number") from None
