"""The arrangements, one module (or package) each, by ``cluster.backend``: how a job's
processes are set out and run.

    in_process   `towers train` alone: one process
    ps_worker    `towers ps` and `towers worker` tasks: variables on the ps tasks
    collective   `towers worker` tasks without ps tasks: gradients all-reduced
    horovod      `towers train` ranks under horovodrun

Each is a class extending its job-file side (``launch.config.arrangements``: its name,
the commands that run it, ``check``, what it refuses) with ``run(job, task, write)``:
this process's part of the job, its final record. How each process finds its share of
the global batch is its plan (``launch.runtime.plan.make_plan``, given the process's
place); its role hooks are its ``launch.runtime.role.Role``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from launch.config import JobConfig
from launch.distributed.arrangements.collective import Collective
from launch.distributed.arrangements.horovod import Horovod
from launch.distributed.arrangements.in_process import InProcess
from launch.distributed.arrangements.ps_worker import PsWorker
from launch.distributed.cluster import Task


class Arrangement(Protocol):
    name: str

    def check(self, job: JobConfig) -> None: ...

    def run(self, job: JobConfig, task: Task | None, write: Callable[[str], None]) -> dict: ...


# Every arrangement by its cluster.backend; launch.config.ARRANGEMENTS has the same names.
ARRANGEMENTS: dict[str, type[Arrangement]] = {
    a.name: a for a in (InProcess, PsWorker, Collective, Horovod)}


def arrangement(name: str) -> Arrangement:
    """The arrangement cluster.backend (or, for auto, the command) chose."""
    return ARRANGEMENTS[name]()


__all__ = ["ARRANGEMENTS", "Arrangement", "arrangement"]
