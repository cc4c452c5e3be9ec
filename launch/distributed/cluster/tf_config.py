"""A cluster from the ``TF_CONFIG`` environment variable, the JSON Kubeflow's TFJob sets:
``{"cluster": {job: [host:port, ...]}, "task": {"type": job, "index": i}}``."""

from __future__ import annotations

import json

from launch.distributed.cluster.resolving import Found, Given, Resolver
from launch.distributed.cluster.task import ALL_JOBS, ClusterError


class TfConfig(Resolver):
    name = "TF_CONFIG"
    task_name = "TF_CONFIG task"
    hint = "set TF_CONFIG"

    def read(self, given: Given) -> Found:
        text = given.environ.get("TF_CONFIG", "").strip()
        if not text:
            return Found()
        try:
            config = json.loads(text)
            cluster = {job: tuple(hosts) for job, hosts in config.get("cluster", {}).items()
                       if hosts}
            task = config.get("task") or None
            role = (str(task["type"]), int(task.get("index", 0))) if task else None
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            raise ClusterError(f"TF_CONFIG: not the JSON TFJob writes ({err})") from None
        unknown = sorted(set(cluster) - set(ALL_JOBS))
        if unknown:
            raise ClusterError(
                f"TF_CONFIG: unknown job(s) {', '.join(unknown)}; accepted: {', '.join(ALL_JOBS)}"
            )
        return Found(cluster, role)
