"""Who is who in a ps/worker job: the cluster spec from its three sources, and this task.

A cluster can be given in the job file (`cluster:`), by the classic flags
(--ps-hosts, --worker-hosts, --job-name, --task-index) or by the TF_CONFIG
variable that Kubeflow's TFJob sets. Any of them may be used, several at once
if they agree; disagreement is an error naming the sources.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass

from launch.config import ClusterConfig
from launch.errors import BadInput, PeerUnavailable

SERVER_JOBS = ("chief", "worker", "ps")  # the jobs that run a tf.distribute.Server
ALL_JOBS = (*SERVER_JOBS, "evaluator")


class ClusterError(BadInput):
    """The cluster cannot be worked out from what was given (bad input)."""


@dataclass(frozen=True)
class Flags:
    """The classic distributed-TensorFlow flags; None where not given."""

    ps_hosts: str | None = None
    worker_hosts: str | None = None
    job_name: str | None = None
    task_index: int | None = None


@dataclass(frozen=True)
class Task:
    """This process's place in the cluster.

    cluster: job name -> addresses, for the jobs that run servers (chief, worker, ps).
    """

    cluster: Mapping[str, tuple[str, ...]]
    job_name: str
    task_index: int

    @property
    def is_chief(self) -> bool:
        """The chief initialises, checkpoints and writes summaries: the chief task if
        the cluster has one, else worker 0."""
        if "chief" in self.cluster:
            return self.job_name == "chief"
        return self.job_name == "worker" and self.task_index == 0

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
    def device(self) -> str:
        return f"/job:{self.job_name}/task:{self.task_index}"

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
            chief_job = "chief" if "chief" in self.cluster else "worker"
            needed[f"{chief_job} 0"] = self.cluster[chief_job][0]
        return needed


def _hosts(text: str | None) -> tuple[str, ...]:
    return tuple(h.strip() for h in (text or "").split(",") if h.strip())


def _from_job_file(cfg: ClusterConfig) -> dict[str, tuple[str, ...]]:
    return {job: tuple(getattr(cfg, job)) for job in ALL_JOBS if getattr(cfg, job)}


def _from_flags(flags: Flags) -> dict[str, tuple[str, ...]]:
    found = {"ps": _hosts(flags.ps_hosts), "worker": _hosts(flags.worker_hosts)}
    return {job: hosts for job, hosts in found.items() if hosts}


def _from_tf_config(environ: Mapping[str, str]) -> tuple[dict, tuple[str, int] | None]:
    """(cluster, (task type, index)) from TF_CONFIG, as TFJob writes it."""
    text = environ.get("TF_CONFIG", "").strip()
    if not text:
        return {}, None
    try:
        config = json.loads(text)
        cluster = {job: tuple(hosts) for job, hosts in config.get("cluster", {}).items() if hosts}
        task = config.get("task") or None
        role = (str(task["type"]), int(task.get("index", 0))) if task else None
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise ClusterError(f"TF_CONFIG: not the JSON TFJob writes ({err})") from None
    unknown = sorted(set(cluster) - set(ALL_JOBS))
    if unknown:
        raise ClusterError(
            f"TF_CONFIG: unknown job(s) {', '.join(unknown)}; accepted: {', '.join(ALL_JOBS)}"
        )
    return cluster, role


def resolve(
    cfg: ClusterConfig, flags: Flags, command: str, environ: Mapping[str, str] = os.environ
) -> Task:
    """This process's Task for `towers ps|worker|evaluator`; ClusterError if unclear.

    command: "ps", "worker" (which also serves as "chief") or "evaluator".
    """
    env_cluster, env_role = _from_tf_config(environ)
    sources = {
        "the job file's cluster section": _from_job_file(cfg),
        "--ps-hosts/--worker-hosts": _from_flags(flags),
        "TF_CONFIG": env_cluster,
    }
    given = {name: c for name, c in sources.items() if c}
    if not given:
        raise ClusterError(
            "cluster: no cluster given; set cluster.ps and cluster.worker in the job file, "
            "pass --ps-hosts and --worker-hosts, or set TF_CONFIG"
        )
    _check_agreement(given)
    full = next(iter(given.values()))
    job_name, task_index = _role(command, flags, env_role, full)
    servers = {job: full[job] for job in SERVER_JOBS if job in full}
    return Task(servers, job_name, task_index)


def _check_agreement(given: dict[str, dict]) -> None:
    """Every source that names a job must name the same addresses for it."""
    names = list(given)
    for job in ALL_JOBS:
        views = {n: given[n][job] for n in names if job in given[n]}
        if len(set(views.values())) > 1:
            detail = "; ".join(f"{n} says {list(v)}" for n, v in views.items())
            raise ClusterError(f"cluster.{job}: sources disagree: {detail}")


def _role(command: str, flags: Flags, env_role, cluster) -> tuple[str, int]:
    """The (job name, task index) from the command, --job-name/--task-index and TF_CONFIG."""
    accepted = ("worker", "chief") if command == "worker" else (command,)
    claims = {}
    if flags.job_name is not None or flags.task_index is not None:
        claims["--job-name/--task-index"] = (flags.job_name, flags.task_index)
    if env_role is not None:
        claims["TF_CONFIG task"] = env_role
    for name, (job, _) in claims.items():
        if job is not None and job not in accepted:
            raise ClusterError(f"{name}: says job {job!r}, but this is `towers {command}`")
    jobs = {job for job, _ in claims.values() if job is not None}
    indices = {index for _, index in claims.values() if index is not None}
    if len(jobs) > 1 or len(indices) > 1:
        detail = "; ".join(f"{n} says {j}:{i}" for n, (j, i) in claims.items())
        raise ClusterError(f"task: sources disagree: {detail}")
    job = jobs.pop() if jobs else accepted[0]
    if job == "worker" and "worker" not in cluster and "chief" in cluster:
        job = "chief"
    if job not in cluster:
        raise ClusterError(f"cluster.{job}: this is a {job} task but the cluster lists no {job}")
    if indices:
        index = indices.pop()
    elif len(cluster[job]) == 1:
        index = 0
    else:
        raise ClusterError(f"task: which {job} is this? pass --task-index or set TF_CONFIG")
    if not 0 <= index < len(cluster[job]):
        raise ClusterError(
            f"task: {job} {index} does not exist; the cluster has {len(cluster[job])} {job} task(s)"
        )
    return job, index


def wait_for_peers(peers: Mapping[str, str], timeout: float, write) -> None:
    """Block until every peer accepts TCP connections, or fail naming those that never did.

    TensorFlow's own wait for a missing task logs every ten seconds and never gives
    up; a bounded wait with the names of the missing tasks is what an operator needs.
    """
    deadline = time.monotonic() + timeout
    waiting = dict(peers)
    announced = False
    while waiting:
        waiting = {name: a for name, a in waiting.items() if not accepts(a)}
        if not waiting:
            return
        if time.monotonic() >= deadline:
            missing = ", ".join(f"{n} at {a}" for n, a in waiting.items())
            raise PeerUnavailable(f"cluster: gave up after {timeout:g} s waiting for {missing}")
        if not announced:
            write(f"waiting for {', '.join(f'{n} at {a}' for n, a in waiting.items())}")
            announced = True
        time.sleep(0.5)


def accepts(address: str) -> bool:
    """Whether host:port accepts a TCP connection within a second."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
            return True
    except OSError:
        return False
