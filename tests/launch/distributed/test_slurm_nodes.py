"""Slurm across nodes: three test hosts, each a node of its own to Slurm and to its
tasks (its own address, hostname and /etc/hosts; tests/helpers/slurm.py), a
controller on a fourth, and the clients there as on a login node.

The steps' environments are the ones Slurm sets on several nodes (a compressed node
list, tasks per node, node ids), resolved as towers resolves them
(launch/distributed/cluster/slurm.py); and the ps/worker example trains across two
nodes, each task running `towers train`.
"""

import pytest
from helpers import net_hosts, slurm
from helpers.launched import task_of

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = slurm.why_unavailable() or net_hosts.why_unavailable()
    if reason:
        pytest.skip(reason)
    net_hosts.sweep_stale()
    network = net_hosts.TestNetwork.create()
    try:
        with slurm.nodes_cluster(tmp_path_factory.mktemp("slurm"), network, 3) as made:
            yield made
    finally:
        network.close()


def test_the_tasks_of_a_three_node_step_agree_on_one_cluster_each_on_its_node(cluster, tmp_path):
    envs = cluster.step_environments(tmp_path, "--nodes=3", "--ntasks-per-node=2")
    assert {env["SLURM_STEP_NODELIST"] for env in envs} == {"n[1-3]"}  # compressed, as Slurm does
    assert {env["SLURM_STEP_TASKS_PER_NODE"] for env in envs} == {"2(x3)"}
    tasks = [task_of(env) for env in envs]
    workers = tasks[0].cluster["worker"]
    assert [a.split(":")[0] for a in workers] == ["n1", "n1", "n2", "n2", "n3", "n3"]
    for rank, (env, task) in enumerate(zip(envs, tasks, strict=True)):
        assert task.cluster == {"worker": workers}
        assert (task.job_name, task.task_index) == ("worker", rank)
        assert workers[rank].split(":")[0] == env["HOSTNAME"]  # it serves where it runs
    roles = [task_of(env, ps_per_node=1) for env in envs]
    assert [(t.job_name, t.task_index) for t in roles] == [
        ("ps", 0), ("worker", 0), ("ps", 1), ("worker", 1), ("ps", 2), ("worker", 2)]
    assert [a.split(":")[0] for a in roles[0].cluster["ps"]] == ["n1", "n2", "n3"]


def test_a_ps_worker_job_across_two_nodes_trains_to_the_end(cluster, tmp_path):
    """A ps task and a worker on each of two nodes: the ps tasks hold the variables
    between them, and the workers reach them across the hosts' network."""
    job = slurm.submit_example(cluster, tmp_path, "ps_worker.sbatch", "--nodes=2",
                               "--ntasks-per-node=2", "--gres=gpu:0", "--cpus-per-task=1",
                               steps=40, task_files=True)
    end = cluster.wait_end(job, timeout=240)
    output = cluster.output(job)
    tasks = slurm.written_since(slurm.task_outputs(tmp_path))
    assert (end.state, end.exit_code) == ("COMPLETED", 0), output[-3000:] + tasks[-3000:]
    assert "towers: srun exited 0" in output
    results = slurm.task_results(tmp_path)
    done = {(r["job"], r["task"]): r for r in results if "task" in r}
    assert done[("worker", 0)]["global_step"] >= 40 and ("worker", 1) in done, tasks[-3000:]
    ps = [r for r in results if r.get("job") == "ps"]
    assert [r["workers_reported"] for r in ps] == [2, 2], tasks[-3000:]
