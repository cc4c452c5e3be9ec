"""launch/distributed/cluster/slurm.py: the cluster of a Slurm step from the environment
of each of its tasks, against environments as Slurm 22.05 sets them, as `towers train`
(or `towers ps|worker`) resolves it beside the other places a cluster may come from.

ONE_NODE is what `srun` set for task 1 of a 3-task step on the one-node test cluster
(tests/helpers/slurm.py), trimmed of what the module does not read; `step` changes it
as a multi-node step sets it (each node's tasks numbered from 0 by SLURM_LOCALID, ranks
running on in block order). tests/launch/distributed/test_slurm_real.py checks the same
rules against environments the real cluster sets.
"""

import json

import pytest
from helpers.launched import task_of

from launch.distributed.cluster import ClusterError, Flags
from launch.distributed.cluster.slurm import PORT_LOW, expand_hostlist, expand_tasks_per_node

ONE_NODE = {
    "SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "vm", "SLURM_JOB_NUM_NODES": "1",
    "SLURM_NTASKS": "3", "SLURM_TASKS_PER_NODE": "3", "SLURM_DISTRIBUTION": "block",
    "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "vm", "SLURM_STEP_NUM_NODES": "1",
    "SLURM_STEP_NUM_TASKS": "3", "SLURM_STEP_TASKS_PER_NODE": "3",
    "SLURM_NODEID": "0", "SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURMD_NODENAME": "vm",
}
BASE = PORT_LOW + 16 * 5  # the port block of job 5


def step(nodelist: str, tasks_per_node: str, rank: int, job_id: int = 5, **extra) -> dict:
    """ONE_NODE as Slurm sets it for task `rank` of a block-distributed step."""
    counts = expand_tasks_per_node(tasks_per_node)
    node = next(n for n in range(len(counts)) if rank < sum(counts[:n + 1]))
    return {**ONE_NODE, "SLURM_JOB_ID": str(job_id),
            "SLURM_STEP_NODELIST": nodelist, "SLURM_JOB_NODELIST": nodelist,
            "SLURM_STEP_TASKS_PER_NODE": tasks_per_node, "SLURM_TASKS_PER_NODE": tasks_per_node,
            "SLURM_STEP_NUM_TASKS": str(sum(counts)), "SLURM_NTASKS": str(sum(counts)),
            "SLURM_STEP_NUM_NODES": str(len(counts)), "SLURM_JOB_NUM_NODES": str(len(counts)),
            "SLURM_PROCID": str(rank), "SLURM_NODEID": str(node),
            "SLURM_LOCALID": str(rank - sum(counts[:node])),
            "SLURMD_NODENAME": expand_hostlist(nodelist)[node], **extra}


# --- Slurm's compressed lists -------------------------------------------------------------

@pytest.mark.parametrize("text, hosts", [
    ("vm", ["vm"]),
    ("node[01-03,07],gpu-a[1-2]", ["node01", "node02", "node03", "node07", "gpu-a1", "gpu-a2"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),
    ("n[008-011]", ["n008", "n009", "n010", "n011"]),
    ("n[1-2]-ib[0-1]", ["n1-ib0", "n1-ib1", "n2-ib0", "n2-ib1"]),
    ("rack1-n[1-2],x", ["rack1-n1", "rack1-n2", "x"]),
    ("n[1-2],n1", ["n1", "n2", "n1"]),  # order kept, nothing dropped, as Slurm does
])
def test_host_lists_expand_as_slurm_expands_them(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["n[2-1]", "n[a-b]", "n[1-2", "n1-2]", "a,,b", ""])
def test_a_malformed_host_list_is_refused_naming_it(text):
    with pytest.raises(ClusterError, match="slurm: "):
        expand_hostlist(text)


@pytest.mark.parametrize("text, counts", [
    ("3", [3]), ("4(x2),3", [4, 4, 3]), ("2,1(x3)", [2, 1, 1, 1]),
])
def test_tasks_per_node_expand(text, counts):
    assert expand_tasks_per_node(text) == counts


# --- one node -----------------------------------------------------------------------------

def test_a_one_node_step_is_a_collective_cluster_of_its_tasks_on_ports_by_local_id():
    task = task_of(ONE_NODE)
    assert task.cluster == {"worker": (f"vm:{BASE}", f"vm:{BASE + 1}", f"vm:{BASE + 2}")}
    assert (task.job_name, task.task_index) == ("worker", 1)
    assert task.gpus is None  # no GPUs in the step: left alone


def test_every_task_of_a_step_sees_the_same_cluster_and_a_different_place_in_it():
    tasks = [task_of(step("vm", "3", rank)) for rank in range(3)]
    assert len({tuple(t.cluster.items()) for t in tasks}) == 1
    assert [t.task_index for t in tasks] == [0, 1, 2]


def test_a_batch_script_and_a_step_of_one_task_are_one_process():
    batch = {k: v for k, v in ONE_NODE.items() if not k.startswith("SLURM_STEP")}
    assert task_of(batch) is None and task_of({}) is None
    alone = step("vm", "1", 0, CUDA_VISIBLE_DEVICES="0,1,2,3", SLURM_GPUS_ON_NODE="4")
    assert task_of(alone) is None  # srun -n 1: a plain job, every GPU of the step its own
    with pytest.raises(ClusterError, match="no cluster given.* run every task under srun"):
        task_of(batch, "worker")


def test_a_step_missing_a_variable_says_to_run_under_srun():
    broken = {k: v for k, v in ONE_NODE.items() if k != "SLURM_STEP_NODELIST"}
    with pytest.raises(ClusterError, match="SLURM_STEP_NODELIST not set: run each task under"):
        task_of(broken)


# --- the other places a cluster comes from ---------------------------------------------

def test_towers_worker_and_ps_under_srun_are_the_tasks_slurm_makes_them():
    assert task_of(ONE_NODE, "worker") == task_of(ONE_NODE)
    ps = step("vm", "3", 0)
    assert (task_of(ps, "ps", ps_per_node=1).job_name, task_of(ps, ps_per_node=1).job_name) == (
        "ps", "ps")


def test_a_task_run_as_another_role_than_slurms_is_told_to_run_train():
    with pytest.raises(ClusterError, match=r"SLURM_PROCID: says job 'ps', but this is `towers "
                                           r"worker`; run `towers train` in every task"):
        task_of(step("vm", "3", 0), "worker", ps_per_node=1)


def test_a_cluster_given_elsewhere_too_must_agree_with_slurms():
    workers = [f"vm:{BASE + i}" for i in range(3)]
    assert task_of(ONE_NODE, worker=workers).task_index == 1
    with pytest.raises(ClusterError, match=r"cluster.worker: sources disagree: the job file's "
                                           r"cluster section says .*; the Slurm step says"):
        task_of(ONE_NODE, worker=["vm:2222", "vm:2223", "vm:2224"])
    tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": 2}}
    with pytest.raises(ClusterError, match=r"task: sources disagree: TF_CONFIG task says "
                                           r"worker:2; the Slurm step's SLURM_PROCID says "
                                           r"worker:1"):
        task_of({**ONE_NODE, "TF_CONFIG": json.dumps(tf_config)})
    with pytest.raises(ClusterError, match="sources disagree"):
        task_of(ONE_NODE, "worker", Flags(worker_hosts="vm:1,vm:2,vm:3"))


# --- several nodes ------------------------------------------------------------------------

NODES = "node[01-03,07],gpu-a[1-2]"  # six nodes


def test_a_multi_node_step_numbers_workers_node_by_node():
    tasks = [task_of(step(NODES, "2(x6)", rank)) for rank in range(12)]
    workers = tasks[0].cluster["worker"]
    assert workers[:4] == (f"node01:{BASE}", f"node01:{BASE + 1}",
                           f"node02:{BASE}", f"node02:{BASE + 1}")
    assert workers[-1] == f"gpu-a2:{BASE + 1}" and len(workers) == 12
    for rank, task in enumerate(tasks):
        assert task.cluster["worker"] == workers
        assert (task.job_name, task.task_index) == ("worker", rank)
        host = expand_hostlist(NODES)[rank // 2]
        assert workers[task.task_index].split(":")[0] == host  # it serves where it runs


def test_uneven_tasks_per_node_follow_slurms_counts():
    tasks = [task_of(step("n[1-3]", "3,2(x2)", rank)) for rank in range(7)]
    assert tasks[0].cluster["worker"] == tuple(
        f"{h}:{BASE + i}" for h, n in [("n1", 3), ("n2", 2), ("n3", 2)] for i in range(n))
    assert [t.task_index for t in tasks] == list(range(7))


def test_ps_per_node_makes_each_nodes_first_tasks_ps_and_worker_0_the_first_worker():
    tasks = [task_of(step("n[1-2]", "3(x2)", rank), ps_per_node=1) for rank in range(6)]
    cluster = tasks[0].cluster
    assert cluster == {"ps": (f"n1:{BASE}", f"n2:{BASE}"),
                       "worker": (f"n1:{BASE + 1}", f"n1:{BASE + 2}",
                                  f"n2:{BASE + 1}", f"n2:{BASE + 2}")}
    roles = [(t.job_name, t.task_index) for t in tasks]
    assert roles == [("ps", 0), ("worker", 0), ("worker", 1),
                     ("ps", 1), ("worker", 2), ("worker", 3)]
    for task in tasks:  # each task's own address is on its own node
        assert task.cluster[task.job_name][task.task_index].startswith(
            step("n[1-2]", "3(x2)", tasks.index(task))["SLURMD_NODENAME"] + ":")


def test_ps_per_node_that_leaves_a_node_without_a_worker_is_refused():
    with pytest.raises(ClusterError, match="cluster.ps_per_node: 1 ps task.* no worker on n2: "
                                           "ask Slurm for at least 2 tasks"):
        task_of(step("n[1-2]", "2,1", 0), ps_per_node=1)


def test_a_cyclic_distribution_is_refused_where_it_changes_the_layout():
    cyclic = step("n[1-2]", "2(x2)", 1, SLURM_DISTRIBUTION="cyclic")
    with pytest.raises(ClusterError, match="--distribution=block"):
        task_of(cyclic)
    # One task per node, or one node: every distribution lays tasks out alike.
    assert task_of(step("n[1-2]", "1(x2)", 1, SLURM_DISTRIBUTION="cyclic")).task_index == 1
    assert task_of({**ONE_NODE, "SLURM_DISTRIBUTION": "cyclic"}).task_index == 1


def test_inconsistent_variables_are_refused_naming_them():
    with pytest.raises(ClusterError, match="do not make SLURM_STEP_NUM_TASKS=4"):
        task_of({**step("n[1-2]", "2(x2)", 1), "SLURM_STEP_NODELIST": "n1"})
    with pytest.raises(ClusterError, match="SLURM_PROCID=3 is not task 1 of node 0"):
        task_of({**step("n[1-2]", "2(x2)", 1), "SLURM_PROCID": "3"})
    with pytest.raises(ClusterError, match="SLURM_LOCALID='x' is not a number"):
        task_of({**ONE_NODE, "SLURM_LOCALID": "x"})


# --- ports --------------------------------------------------------------------------------

def test_ports_come_from_the_job_id_so_two_jobs_on_a_node_do_not_collide():
    ports = {job: {int(a.rsplit(":", 1)[1]) for a in
                   task_of(step("vm", "16", 0, job_id=job)).cluster["worker"]}
             for job in (1000, 1001, 1999)}
    assert not ports[1000] & ports[1001] and not ports[1001] & ports[1999]
    assert min(ports[1000]) == PORT_LOW and max(ports[1999]) == PORT_LOW + 16 * 1000 - 1 < 32768


def test_a_given_port_base_is_used_and_more_than_16_tasks_on_a_node_need_one():
    with pytest.raises(ClusterError, match="17 tasks on one node.*set cluster.port_base"):
        task_of(step("vm", "17", 0))
    task = task_of(step("vm", "17", 16), port_base=2222)
    assert task.cluster["worker"][16] == "vm:2238"
    with pytest.raises(ClusterError, match="cluster.port_base: 65520 leaves no room for 17"):
        task_of(step("vm", "17", 16), port_base=65520)


# --- GPUs ---------------------------------------------------------------------------------

def test_gpus_slurm_bound_to_each_task_are_kept():
    # srun --gpus-per-task=1: each task sees its own GPU, fewer than the node's two.
    env = step("vm", "2", 1, CUDA_VISIBLE_DEVICES="1", SLURM_STEP_GPUS="1",
               SLURM_GPUS_ON_NODE="2")
    assert task_of(env).gpus == "1"


@pytest.mark.parametrize("tasks, shares", [
    ("2", ["0,1", "2,3"]), ("4", ["0", "1", "2", "3"]), ("3", ["0,1", "2", "3"]),
])
def test_gpus_every_task_sees_are_split_among_the_nodes_workers(tasks, shares):
    # srun --gres=gpu:4: every task of the node sees all four.
    gpus = {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "SLURM_GPUS_ON_NODE": "4"}
    assert [task_of(step("vm", tasks, r, **gpus)).gpus
            for r in range(int(tasks))] == shares


def test_ps_tasks_get_no_gpu_and_the_workers_split_the_nodes_gpus():
    gpus = {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "SLURM_GPUS_ON_NODE": "4"}
    seen = [task_of(step("n[1-2]", "5(x2)", r, **gpus), ps_per_node=1).gpus
            for r in range(10)]
    assert seen == ["", "0", "1", "2", "3"] * 2


def test_more_workers_than_gpus_on_a_node_is_refused():
    gpus = {"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_GPUS_ON_NODE": "2"}
    with pytest.raises(ClusterError, match="3 workers on this node share 2 GPU"):
        task_of(step("vm", "3", 0, **gpus))
