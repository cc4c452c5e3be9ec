"""Slurm for real: a one-node cluster of Debian's slurm-wlm (tests/helpers/slurm.py), its
srun steps' environments resolved as towers resolves them
(launch/distributed/cluster/slurm.py), and the sbatch examples of examples/slurm run as
written, each task running `towers train` (as `python -m launch train`, the tree under
test): sbatch, srun, scancel, scontrol requeue, Slurm's signals, and the examples' own
traps.
"""

import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Sequence

import pytest
from helpers import slurm
from helpers.checkpoints import latest_step
from helpers.launched import task_of

from launch.distributed.cluster.slurm import expand_hostlist

pytestmark = pytest.mark.e2e

# One node, CPUs only: the examples' GPU requests are overridden on the command line.
ON_THIS_NODE = ["--nodes=1", "--gpus-per-task=0", "--gres=gpu:0", "--cpus-per-task=1"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = slurm.why_unavailable()
    if reason:
        pytest.skip(reason)
    with slurm.cluster(tmp_path_factory.mktemp("slurm"), gpus=4) as made:
        yield made


# --- the environment of real steps --------------------------------------------------------

def test_host_lists_expand_as_slurm_itself_expands_them(cluster):
    for text in ["node[01-03,07],gpu-a[1-2]", "n[008-011]", "n[8-11]", "n[1-2]-ib[0-1]",
                 "rack1-n[1-2],x", "n[1-2],n1", cluster.node]:
        shown = cluster.command("scontrol", "show", "hostnames", text).stdout.split()
        assert expand_hostlist(text) == shown, text


def test_the_tasks_of_a_real_step_agree_on_one_cluster_of_reachable_addresses(cluster, tmp_path):
    envs = cluster.step_environments(tmp_path, "--ntasks=3")
    tasks = [task_of(env) for env in envs]
    workers = tasks[0].cluster["worker"]
    assert all(t.cluster == {"worker": workers} for t in tasks)
    assert [(t.job_name, t.task_index) for t in tasks] == [("worker", i) for i in range(3)]
    hosts = {a.rsplit(":", 1)[0] for a in workers}
    assert hosts == {cluster.node} == {env["SLURMD_NODENAME"] for env in envs}
    assert socket.gethostbyname(cluster.node)  # the node list's names resolve
    assert len({a.rsplit(":", 1)[1] for a in workers}) == 3
    assert all(t.gpus is None for t in tasks)  # no GPUs asked for


def test_a_step_of_one_task_is_one_process(cluster, tmp_path):
    (env,) = cluster.step_environments(tmp_path, "--ntasks=1", "--gres=gpu:4")
    assert env["SLURM_STEP_NUM_TASKS"] == "1" and task_of(env) is None


def test_gpus_slurm_binds_to_each_task_are_kept(cluster, tmp_path):
    envs = cluster.step_environments(tmp_path, "--ntasks=2", "--gpus-per-task=1")
    seen = [task_of(env).gpus for env in envs]
    assert sorted(seen) == ["0", "1"]
    assert seen == [env["CUDA_VISIBLE_DEVICES"] for env in envs]


def test_gpus_every_task_sees_are_split_and_ps_tasks_get_none(cluster, tmp_path):
    envs = cluster.step_environments(tmp_path, "--ntasks=3", "--gres=gpu:4")
    assert {env["CUDA_VISIBLE_DEVICES"] for env in envs} == {"0,1,2,3"}  # as Slurm sets it
    assert [task_of(env).gpus for env in envs] == ["0,1", "2", "3"]
    roles = [task_of(env, ps_per_node=1) for env in envs]
    assert [(t.job_name, t.gpus) for t in roles] == [("ps", ""), ("worker", "0,1"),
                                                     ("worker", "2,3")]


# --- the sbatch examples, training --------------------------------------------------------

def submit(cluster, tmp_path, example: str, tasks: int, steps: int, *towers_args: str) -> int:
    """The example on this node, each task writing a file of its own (slurm.task_outputs):
    the tasks stop at once, and in one shared file srun cut one task's result line with
    another's "stopped on signal" (docs/slurm.md)."""
    return slurm.submit_example(cluster, tmp_path, example, *ON_THIS_NODE,
                                f"--ntasks-per-node={tasks}", steps=steps,
                                towers_args=towers_args, task_files=True)


def wait_for(cluster, job: int, tmp_path, pattern: str, since: Sequence[str] = (),
             timeout: float = 120) -> None:
    """Until `pattern` appears in what the job's tasks wrote past `since` (task_outputs
    read earlier)."""
    deadline = time.monotonic() + timeout
    while True:
        written = slurm.written_since(slurm.task_outputs(tmp_path), since)
        if re.search(pattern, written):
            return
        assert time.monotonic() < deadline, (pattern, written[-3000:])
        assert cluster.state(job) not in slurm.ENDED, written[-3000:]
        time.sleep(0.2)


def towers_pid(cluster, job: int, rank: int) -> int:
    """The towers process of task `rank` (the child of the task's shell)."""
    listed = cluster.command("scontrol", "listpids", str(job)).stdout.splitlines()[1:]
    rows = [line.split() for line in listed]
    shell = next(int(r[0]) for r in rows if r[2] == "0" and r[4] == str(rank))
    for row in rows:
        with open(f"/proc/{row[0]}/stat") as f:
            if int(f.read().rsplit(")", 1)[1].split()[1]) == shell:
                return int(row[0])
    raise AssertionError(f"no child of task {rank}'s shell {shell} in {listed}")


def test_the_collective_example_requeued_on_138_and_near_its_time_limit_resumes_to_the_end(
        cluster, tmp_path):
    """Run 1: a worker is killed, the other ends with 138 and requeues the job. Run 2:
    resumes; the early warning (USR1 to the batch script, as --signal=B:USR1 sends it)
    makes both save and exit 0, and the script requeues. Run 3: resumes and trains to
    train.steps, which the job file now sets a little past the saved step; every task
    exits 0."""
    job = submit(cluster, tmp_path, "collective.sbatch", 2, 100_000,
                 "--set", "train.checkpoint_every_steps=20",
                 "--set", "cluster.operation_timeout_secs=10")
    wait_for(cluster, job, tmp_path, r"saved checkpoint at step [1-9]")
    os.kill(towers_pid(cluster, job, 1), signal.SIGKILL)
    cluster.wait_state(job, {"PENDING", "REQUEUED"}, timeout=60)
    tasks, script = [slurm.task_outputs(tmp_path)], [cluster.output(job)]  # at each run's end
    first = slurm.written_since(tasks[0])
    assert re.search(r"towers: error: .*worker 1", first), first[-3000:]  # names it

    wait_for(cluster, job, tmp_path, r"step \d+/100000", since=tasks[0], timeout=180)
    cluster.scancel(job, "--batch", "--signal=USR1")
    cluster.wait_state(job, {"PENDING", "REQUEUED"}, timeout=120)
    tasks.append(slurm.task_outputs(tmp_path))
    script.append(cluster.output(job))
    second = slurm.written_since(tasks[1], tasks[0])
    second_script = script[1][len(script[0]):]
    saved_at = latest_step(tmp_path / "ckpt")
    slurm.write_job(tmp_path, steps=saved_at + 20)  # the next run reads it as it starts
    assert "towers: srun exited 0" in second_script, second_script[-3000:]
    assert [r["stopped_by"] for r in slurm.results(second)] == ["signal", "signal"]
    assert saved_at > resumed_step(second)

    end = cluster.wait_end(job, timeout=240, restarts=2)
    third = slurm.written_since(slurm.task_outputs(tmp_path), tasks[1])
    third_script = cluster.output(job)[len(script[1]):]
    assert (end.state, end.exit_code) == ("COMPLETED", 0), third[-3000:]
    assert resumed_step(third) == saved_at and "towers: srun exited 0" in third_script
    done = slurm.results(third)
    assert sorted((r["job"], r["task"]) for r in done) == [("worker", 0), ("worker", 1)]
    assert all("stopped_by" not in r for r in done), done
    assert latest_step(tmp_path / "ckpt") == saved_at + 20


def test_the_ps_worker_example_saves_and_exits_0_on_scancel_each_task_with_its_gpus(
        cluster, tmp_path):
    """One node, a ps task and two workers sharing the node's 4 GPUs (`--gres=gpu:4`, as
    the script asks): scancel sends every task one SIGTERM; the chief saves, every task
    exits 0, and the job ends CANCELLED."""
    job = slurm.submit_example(cluster, tmp_path, "ps_worker.sbatch", "--nodes=1",
                               "--ntasks-per-node=3", "--gres=gpu:4", "--cpus-per-task=1",
                               steps=100_000, task_files=True)
    wait_for(cluster, job, tmp_path, r"step \d+/100000")
    cluster.scancel(job)
    end = cluster.wait_end(job, timeout=120)
    output, tasks = cluster.output(job), slurm.written_since(slurm.task_outputs(tmp_path))
    assert end.state == "CANCELLED" and "towers: srun exited 0" in output, output[-3000:]
    done = {(r["job"], r["task"]): r for r in slurm.task_results(tmp_path)}
    assert set(done) == {("ps", 0), ("worker", 0), ("worker", 1)}, tasks[-3000:]
    assert {r.get("stopped_by") for r in done.values()} == {"signal"}
    assert latest_step(tmp_path / "ckpt") >= done[("worker", 0)]["global_step"] > 0
    shares = sorted(re.findall(r'(\w+ \d): CUDA_VISIBLE_DEVICES="([\d,]*)"', tasks))
    assert shares == [("ps 0", ""), ("worker 0", "0,1"), ("worker 1", "2,3")], tasks[-3000:]


def resumed_step(output: str) -> int:
    return int(re.search(r"resuming from \S+ at step (\d+)", output).group(1))


def test_the_horovod_script_which_the_suite_does_not_run_is_valid_bash():
    checked = subprocess.run(["bash", "-n", str(slurm.EXAMPLES / "horovod.sbatch")],
                             capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr
