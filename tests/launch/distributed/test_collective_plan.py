"""A job without ps tasks, before any process starts: what each worker runs where, its
session options, what is refused, and the cluster local-cluster gives it."""

import json

import pytest
from helpers.commands import run_in_process

from launch.config import from_dict
from launch.distributed.arrangements.collective import collective_plan, peers
from launch.distributed.cluster import Flags, Task, resolve
from launch.distributed.local_cluster import plan_tasks

HOSTS = ("10.0.1.0:2222", "10.0.1.1:2222", "10.0.1.2:2222")
JOB = {"model": {"name": "mlp"}, "data": {"source": "synthetic"},
       "train": {"batch_size": 64}, "towers": {"devices": 2}}


def test_each_worker_keeps_its_variables_on_itself_and_takes_its_share():
    job = from_dict(JOB)
    plans = [collective_plan(job, Task({"worker": HOSTS}, "worker", i)) for i in range(3)]
    assert [p.process_batch_size for p, _ in plans] == [22, 21, 21]
    assert [p.share for p, _ in plans] == [(0, 3), (1, 3), (2, 3)]
    plan, group = plans[1]
    assert plan.devices == ["/job:worker/task:1/cpu:0", "/job:worker/task:1/cpu:1"]
    assert plan.param_device == plan.aggregation == group.device == "/job:worker/task:1/cpu:0"
    assert (group.size, plan.job_examples_per_step) == (3, 64)
    assert plan.reduce_gradients is not None


def test_the_chief_leads_the_group_and_a_session_sees_only_its_own_task():
    job = from_dict({**JOB, "cluster": {"operation_timeout_secs": 30,
                                        "startup_timeout_secs": 50}})
    cluster = {"chief": HOSTS[:1], "worker": HOSTS[1:]}
    plan, _ = collective_plan(job, Task(cluster, "worker", 1))
    session = plan.session
    assert session.experimental.collective_group_leader == "/job:chief/replica:0/task:0"
    assert list(session.device_filters) == ["/job:worker/task:1"]
    assert session.operation_timeout_in_ms == 50_000
    assert peers(Task(cluster, "worker", 1)) == {"chief 0": HOSTS[0], "worker 0": HOSTS[1]}


def test_a_tfjob_without_ps_is_a_collective_job():
    env = {"TF_CONFIG": json.dumps({"cluster": {"chief": [HOSTS[0]], "worker": list(HOSTS[1:])},
                                    "task": {"type": "worker", "index": 0}})}
    task = resolve(from_dict({}).cluster, Flags(), "worker", env)
    assert "ps" not in task.cluster and task.worker_rank == 1 and task.num_workers == 3


@pytest.mark.parametrize("setting, key", [
    ("train.backup_workers=1", "train.backup_workers"),
    ("towers.variable_update=replicated", "towers.variable_update"),
    ("towers.batch_norm=sync", "towers.batch_norm"),
])
def test_what_a_collective_job_cannot_do_is_one_line_and_exit_2(setting, key):
    result = run_in_process("worker", "--set", "model.name=mlp", "--set", "data.source=synthetic",
                            "--set", "train.sync=true", "--set", setting,
                            "--worker-hosts", "127.0.0.1:1,127.0.0.1:2", "--task-index", "1")
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("towers: error:")]
    assert len(lines) == 1 and f"{key}:" in lines[0] and "no ps tasks" in lines[0], result.stderr


def test_local_cluster_with_no_ps_starts_workers_with_no_ps_hosts():
    tasks = plan_tasks(None, [], num_ps=0, num_workers=2, evaluator=False)
    assert [t.name for t in tasks] == ["worker0", "worker1"]
    assert all("--ps-hosts" not in t.args for t in tasks)
