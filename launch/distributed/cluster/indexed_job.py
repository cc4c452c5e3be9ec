"""A cluster from the Kubernetes Indexed Job (no Kubeflow) this process is a pod of,
worked out by each pod from its environment: a collective cluster of one worker per pod.

Kubernetes gives each pod of an Indexed Job its index (JOB_COMPLETION_INDEX, 0 ..
completions-1) and the hostname `<job name>-<index>`; a headless Service named as the
pods' `subdomain` gives each of them the DNS name `<job name>-<index>.<service>` in
the namespace. The manifest (docker/k8s/indexed-job.yaml) tells each pod the rest:

    TOWERS_K8S_JOB      the Job's name (from its label batch.kubernetes.io/job-name)
    TOWERS_K8S_SERVICE  the headless Service, the pods' subdomain
    TOWERS_K8S_WORKERS  the Job's completions: how many workers

Worker i is the pod of index i at `<job>-<i>.<service>:<port>`, the port being
cluster.port_base (2222 if unset); worker 0 is the chief. A job of one pod is no
cluster (a one-process job). Each pod has the GPUs its resources ask for, so
CUDA_VISIBLE_DEVICES is left alone. TOWERS_K8S_SERVICE is what makes a pod a task:
JOB_COMPLETION_INDEX alone is in every Indexed Job, whose pods may as well be
independent jobs (a sweep, one setting per index). Pure: no TensorFlow, no network.
"""

from __future__ import annotations

from collections.abc import Mapping

from launch.distributed.cluster.resolving import Found, Given, Resolver
from launch.distributed.cluster.task import ClusterError

INDEX = "JOB_COMPLETION_INDEX"
REQUIRED = (INDEX, "TOWERS_K8S_JOB", "TOWERS_K8S_SERVICE", "TOWERS_K8S_WORKERS")
DEFAULT_PORT = 2222


class IndexedJob(Resolver):
    name = "the Indexed Job"
    task_name = "the Indexed Job's JOB_COMPLETION_INDEX"
    hint = "run in a Kubernetes Indexed Job set up as docker/k8s/indexed-job.yaml is"
    launcher = True

    def read(self, given: Given) -> Found:
        environ = given.environ
        if "TOWERS_K8S_SERVICE" not in environ:
            return Found()
        missing = [name for name in REQUIRED if not environ.get(name, "").strip()]
        if missing:
            raise ClusterError(
                f"kubernetes: {', '.join(missing)} not set: run towers in an Indexed Job "
                "whose pods set them, as docker/k8s/indexed-job.yaml does")
        index, workers = _number(environ, INDEX), _number(environ, "TOWERS_K8S_WORKERS")
        if not 0 <= index < workers:
            raise ClusterError(f"kubernetes: {INDEX}={index} is not below TOWERS_K8S_WORKERS="
                               f"{workers}; set TOWERS_K8S_WORKERS to the Job's completions")
        if workers == 1:
            return Found()
        if given.cfg.ps_per_node:
            raise ClusterError(
                f"cluster.ps_per_node: {given.cfg.ps_per_node}, but each pod of an Indexed Job "
                "is one worker (all its pods share one template, GPUs and all); set it to 0, "
                "or run a ps/worker job as a TFJob (docker/k8s/tfjob.yaml)")
        port = given.cfg.port_base or DEFAULT_PORT
        job, service = environ["TOWERS_K8S_JOB"].strip(), environ["TOWERS_K8S_SERVICE"].strip()
        workers_at = tuple(f"{job}-{i}.{service}:{port}" for i in range(workers))
        return Found({"worker": workers_at}, ("worker", index))


def _number(environ: Mapping[str, str], name: str) -> int:
    try:
        return int(environ[name])
    except ValueError:
        raise ClusterError(f"kubernetes: {name}={environ[name]!r} is not a number") from None
