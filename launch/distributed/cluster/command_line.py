"""A cluster from the classic distributed-TensorFlow flags: --ps-hosts and --worker-hosts
(the addresses), --job-name and --task-index (this task)."""

from __future__ import annotations

from launch.distributed.cluster.resolving import Found, Given, Resolver


class CommandLine(Resolver):
    name = "--ps-hosts/--worker-hosts"
    task_name = "--job-name/--task-index"
    hint = "pass --ps-hosts and --worker-hosts"

    def read(self, given: Given) -> Found:
        flags = given.flags
        jobs = {"ps": _hosts(flags.ps_hosts), "worker": _hosts(flags.worker_hosts)}
        task = None
        if flags.job_name is not None or flags.task_index is not None:
            task = (flags.job_name, flags.task_index)
        return Found({job: hosts for job, hosts in jobs.items() if hosts}, task)


def _hosts(text: str | None) -> tuple[str, ...]:
    return tuple(h.strip() for h in (text or "").split(",") if h.strip())
