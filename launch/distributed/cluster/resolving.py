"""What every place a cluster's description comes from gives (``Found``), and how this
process's task is worked out from all of them: places that name a job must agree on its
addresses, places that name this task must agree on it, and the job they name must be
one the command runs (``ROLES``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from launch.config import ClusterConfig
from launch.distributed.cluster.task import ALL_JOBS, SERVER_JOBS, ClusterError, Task

Cluster = Mapping[str, tuple[str, ...]]  # job name -> its tasks' host:port addresses


@dataclass(frozen=True)
class Flags:
    """The classic distributed-TensorFlow flags; None where not given."""

    ps_hosts: str | None = None
    worker_hosts: str | None = None
    job_name: str | None = None
    task_index: int | None = None


@dataclass(frozen=True)
class Given:
    """Everything a process is told: the job file's cluster section, its command line's
    flags, its environment."""

    cfg: ClusterConfig
    flags: Flags
    environ: Mapping[str, str]


@dataclass(frozen=True)
class Found:
    """What one place says: the cluster's jobs (empty: it names none) and this task as
    (job, index), either part None where it does not say (None: it says nothing of it).
    gpus: what CUDA_VISIBLE_DEVICES must be for this task ("" for none), where the place
    shares a host's GPUs among its tasks; None leaves it as it is."""

    cluster: Cluster = field(default_factory=dict)
    task: tuple[str | None, int | None] | None = None
    gpus: str | None = None


class Resolver:
    """One place a cluster's description comes from.

    name: the place, in messages ("TF_CONFIG says ..."); task_name: the same for what it
    says of this task, where that differs. hint: how to give a cluster there.
    launcher: the place is what started every task of the job and tells each its own
    (a Slurm step, an Indexed Job), so every task may run one command, `towers train`,
    and be the task it is told.
    """

    name: ClassVar[str]
    task_name: ClassVar[str] = ""
    hint: ClassVar[str]
    launcher: ClassVar[bool] = False

    def read(self, given: Given) -> Found:
        raise NotImplementedError


# The jobs a command's task may be, the first when no place says. `towers worker` also
# serves as the chief. `towers train`, a task only under a launcher, is whatever the
# launcher makes it, so that one command, the same in every task of a Slurm step or an
# Indexed Job, runs its ps tasks and its workers.
ROLES = {"ps": ("ps",), "worker": ("worker", "chief"), "evaluator": ("evaluator",),
         "train": ("worker", "chief", "ps")}


def task_from(found: Mapping[Resolver, Found], command: str) -> Task:
    """This process's Task for `towers COMMAND` (a key of ROLES) from what each place
    said; ClusterError if it is unclear."""
    given = {r.name: f.cluster for r, f in found.items() if f.cluster}
    if not given:
        hints = [r.hint for r in found]
        raise ClusterError(f"cluster: no cluster given; {', '.join(hints[:-1])}, or {hints[-1]}")
    _check_agreement(given)
    full = next(iter(given.values()))
    claims = {r: f.task for r, f in found.items() if f.task is not None}
    job_name, task_index = _role(command, claims, full)
    servers = {job: full[job] for job in SERVER_JOBS if job in full}
    gpus = next((f.gpus for f in found.values() if f.gpus is not None), None)
    return Task(servers, job_name, task_index, gpus)


def _check_agreement(given: dict[str, Cluster]) -> None:
    """Every place that names a job must name the same addresses for it."""
    for job in ALL_JOBS:
        views = {name: cluster[job] for name, cluster in given.items() if job in cluster}
        if len(set(views.values())) > 1:
            detail = "; ".join(f"{n} says {list(v)}" for n, v in views.items())
            raise ClusterError(f"cluster.{job}: sources disagree: {detail}")


def _role(command: str, claims: dict[Resolver, tuple], cluster: Cluster) -> tuple[str, int]:
    """The (job name, task index) from the command and what the places claim."""
    accepted = ROLES[command]
    for place, (job, _) in claims.items():
        if job is not None and job not in accepted:
            hint = (f"; run `towers train` in every task, which is the task {place.name} "
                    "makes it" if place.launcher else "")
            raise ClusterError(f"{place.task_name or place.name}: says job {job!r}, but this "
                               f"is `towers {command}`{hint}")
    jobs = {job for job, _ in claims.values() if job is not None}
    indices = {index for _, index in claims.values() if index is not None}
    if len(jobs) > 1 or len(indices) > 1:
        detail = "; ".join(f"{p.task_name or p.name} says {j}:{i}"
                           for p, (j, i) in claims.items())
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
