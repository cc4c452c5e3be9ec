"""What each arrangement refuses: the job-file side of the ways a job's processes are set out.

``cluster.backend`` names the arrangement: ``in_process`` (one process, `towers train`),
``ps_worker`` (`towers ps` and `towers worker` tasks sharing variables on the ps
tasks), ``collective`` (`towers worker` tasks without ps tasks, all-reducing their
gradients) or ``horovod`` (`towers train` ranks under horovodrun). ``auto``, the
default, lets the command choose: `towers train` runs in one process, a cluster with ps
tasks is a ps/worker job, one without is a collective job. Under a launcher (a Slurm
step of several tasks, a Kubernetes Indexed Job: launch.distributed.cluster) every
task runs `towers train` and is the ps or worker task the launcher makes it, unless
cluster.backend says in_process (``train_is_task``).

Each arrangement states here, once, what it cannot do (``check``); a job is checked
against the arrangement it runs under as it loads (``check_arrangement``, called by
``launch.config.load_job``), so a refusal is one line naming the key, reported before
TensorFlow is imported and before any task starts. How an arrangement runs is its
module of the same name in ``launch/distributed/arrangements/``, whose class extends the
one here.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from types import MappingProxyType
from typing import Any, ClassVar

from launch.config.checks import Invalid, accepted
from launch.config.job import JobConfig

AUTO = "auto"


class ArrangementRules:
    """An arrangement's job-file side: its name, the commands that run its processes,
    what it refuses.

    where: how messages say "in such a job", e.g. 'in ps/worker jobs'. runs_as: how
    its processes are started, for the message of a command that does not start them.
    tasks: its processes are the tasks of a cluster, each told its place; `towers
    train` is one only under a launcher.
    """

    name: ClassVar[str]
    where: ClassVar[str]
    commands: ClassVar[tuple[str, ...]]
    runs_as: ClassVar[str]
    tasks: ClassVar[bool] = False

    def check(self, job: JobConfig) -> None:
        """Invalid, naming the key, for a setting this arrangement cannot run."""

    def fits(self, cluster: Collection[str]) -> str | None:
        """What is wrong with a cluster of these jobs for this arrangement, or None."""
        return None


def no_sync_batch_norm(job: JobConfig, arrangement: ArrangementRules) -> None:
    """Workers in sessions of their own share no batch statistics."""
    if job.towers.batch_norm == "sync":
        raise Invalid(f"sync is not available {arrangement.where}: the workers do not share "
                      "batch statistics, so each would normalize by its own share; use "
                      "local, or --backend horovod", "towers.batch_norm", ["cluster.backend"])


def one_copy_per_process(job: JobConfig, why: str) -> None:
    """The towers inside each process share one copy of the variables (``why``)."""
    if job.towers.variable_update != "parameter_server":
        raise Invalid(f"{why}; use parameter_server, not {job.towers.variable_update}",
                      "towers.variable_update", ["cluster.backend"])


class InProcessRules(ArrangementRules):
    name = "in_process"
    where = "in one process"
    commands = ("train",)
    runs_as = "one process (`towers train`)"


class PsWorkerRules(ArrangementRules):
    name = "ps_worker"
    where = "in ps/worker jobs"
    commands = ("ps", "worker", "local-cluster", "train")
    runs_as = ("`towers ps` and `towers worker` tasks (or `towers local-cluster`, or "
               "`towers train` in every task of a Slurm step with cluster.ps_per_node)")
    tasks = True

    def check(self, job: JobConfig) -> None:
        one_copy_per_process(job, "ps/worker jobs keep variables on the ps tasks")
        no_sync_batch_norm(job, self)
        if job.train.sync and job.train.moving_average_decay is not None:
            # Every worker runs its step's state updates, and the chief's queue runner
            # applies the update apart from any of them: no step of a worker is the
            # job's one update.
            raise Invalid("weight averages are not kept in a synchronous ps/worker job: each "
                          "worker's step would move them; use an asynchronous job (train.sync: "
                          "false), a collective or Horovod job, or in-process towers",
                          "train.moving_average_decay", ["train.sync", "cluster.backend"])

    def fits(self, cluster: Collection[str]) -> str | None:
        return None if "ps" in cluster else "a ps/worker job needs at least one ps task"


class CollectiveRules(ArrangementRules):
    name = "collective"
    where = "in a collective job (no ps tasks)"
    commands = ("worker", "local-cluster", "train")
    runs_as = ("`towers worker` tasks (or `towers local-cluster --ps 0`, or `towers train` "
               "in every task of a Slurm step or a Kubernetes Indexed Job)")
    tasks = True

    def check(self, job: JobConfig) -> None:
        one_copy_per_process(job, "the towers inside each worker of a collective job (no ps "
                                  "tasks) share as parameter_server does")
        if job.train.backup_workers:
            raise Invalid("a collective job (no ps tasks) steps every worker together and has "
                          "no backup workers; set it to 0, or add ps tasks",
                          "train.backup_workers", ["cluster.backend"])
        no_sync_batch_norm(job, self)

    def fits(self, cluster: Collection[str]) -> str | None:
        return ("a collective job has no ps tasks (it all-reduces its workers' gradients)"
                if "ps" in cluster else None)


class HorovodRules(ArrangementRules):
    name = "horovod"
    where = "with horovod"
    commands = ("train",)
    runs_as = "`towers train` ranks under horovodrun"

    def check(self, job: JobConfig) -> None:
        if job.towers.gradient_dtype == "bfloat16":
            raise Invalid("Horovod has no bfloat16 all-reduce; send 16-bit gradients as "
                          "float16 (Horovod's fp16 compression) or float32",
                          "towers.gradient_dtype", ["cluster.backend"])
        if isinstance(job.towers.devices, tuple):
            raise Invalid(f"under horovod give a count of devices per rank (or auto), not a "
                          f"list ({', '.join(job.towers.devices)}); each rank picks its own by "
                          "local_rank", "towers.devices", ["cluster.backend"])


# Every arrangement by its cluster.backend; launch/distributed/arrangements/ has the same.
ARRANGEMENTS: Mapping[str, ArrangementRules] = MappingProxyType(
    {a.name: a for a in (InProcessRules(), PsWorkerRules(), CollectiveRules(), HorovodRules())})
BACKENDS = (AUTO, *ARRANGEMENTS)


def named(backend: str) -> ArrangementRules | None:
    """The arrangement cluster.backend names; None for auto; Invalid for an unknown name."""
    if backend == AUTO:
        return None
    if backend not in ARRANGEMENTS:
        raise Invalid(f"unknown value {backend!r}; {accepted(backend, BACKENDS)}",
                      "cluster.backend")
    return ARRANGEMENTS[backend]


def train_is_task(backend: str) -> bool:
    """Whether `towers train` under a launcher (a Slurm step of several tasks, an Indexed
    Job) is the task the launcher makes it: unless cluster.backend says in_process, one
    process whatever started it (each task of a step alone: a sweep, say)."""
    return backend != InProcessRules.name


def choose(backend: str, command: str | None, cluster: Collection[str]) -> str:
    """The arrangement ``command`` runs a job under, for a cluster of these jobs ('ps',
    'worker', 'chief'; none for one process, which `towers train` is but under a
    launcher): the one cluster.backend names, or for auto one process, a ps/worker job
    where there are ps tasks, a collective job where there are only workers. command
    None: whatever command runs the job (`towers validate`). Invalid at cluster.backend
    for a named arrangement that the command does not run or the cluster does not fit."""
    arrangement = named(backend)
    if arrangement is None:
        if not cluster:
            return InProcessRules.name
        return PsWorkerRules.name if "ps" in cluster else CollectiveRules.name
    if command is not None and command not in arrangement.commands:
        raise Invalid(f"{backend} runs as {arrangement.runs_as}, not `towers {command}`",
                      "cluster.backend")
    if command == "train" and bool(cluster) != arrangement.tasks:
        launchers = "a Slurm step of several tasks or of a Kubernetes Indexed Job"
        raise Invalid(f"{backend} runs as {arrangement.runs_as}, not as a task of {launchers}"
                      if cluster else f"{backend} runs as {arrangement.runs_as}; this `towers "
                      f"train` is not a task of {launchers}", "cluster.backend")
    problem = arrangement.fits(cluster) if cluster else None
    if problem:
        raise Invalid(f"{backend}: {problem}; the cluster has {', '.join(sorted(cluster))}",
                      "cluster.backend")
    return backend


def check_arrangement(job: JobConfig, name: str) -> None:
    """The job against arrangement ``name`` (auto: none); Invalid naming the key."""
    arrangement = named(name)
    if arrangement is not None:
        arrangement.check(job)


# The spelling of an arrangement before cluster.backend: towers.variable_update meant
# both how towers share gradients and whether processes are Horovod ranks.
OLD_SPELLING = ("towers", "variable_update", "horovod")


def respelled(raw: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """A raw job with ``towers.variable_update: horovod`` read as ``cluster.backend:
    horovod`` (towers then share as parameter_server, as Horovod ranks' towers did), and
    the note telling the new spelling; (raw, None) when it has no old spelling."""
    section, key, value = OLD_SPELLING
    towers = raw.get(section)
    cluster = raw.get("cluster") or {}
    if not isinstance(towers, dict) or towers.get(key) != value or not isinstance(cluster, dict):
        return raw, None
    if cluster.get("backend", AUTO) not in (AUTO, value):
        raise Invalid(f"{cluster['backend']!r}, but towers.variable_update: horovod (the old "
                      "spelling of cluster.backend: horovod) says horovod; keep one",
                      "cluster.backend", [f"{section}.{key}"])
    towers = {k: v for k, v in towers.items() if k != key}
    note = ("towers.variable_update: horovod is now spelled cluster.backend: horovod "
            "(towers.variable_update says how the towers inside a process share gradients); "
            "read as that")
    return {**raw, section: towers, "cluster": {**cluster, "backend": value}}, note
