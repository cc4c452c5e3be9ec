"""A cluster from the job file's ``cluster`` section (its tasks' addresses; it names no
task: the command and the other places do)."""

from __future__ import annotations

from launch.distributed.cluster.resolving import Found, Given, Resolver
from launch.distributed.cluster.task import ALL_JOBS


class JobFile(Resolver):
    name = "the job file's cluster section"
    hint = "set cluster.ps and cluster.worker in the job file"

    def read(self, given: Given) -> Found:
        cfg = given.cfg
        return Found({job: tuple(getattr(cfg, job)) for job in ALL_JOBS if getattr(cfg, job)})
