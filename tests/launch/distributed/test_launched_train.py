"""`towers train` in a task of a launcher (here a Slurm step, as its environment says),
as the command takes it: the task's share of the node's GPUs is its own before
TensorFlow starts, cluster.backend in_process keeps every task one process of its own,
and the arrangements that cannot run as a launcher's task say so before it starts.

TensorFlow's start is where these tests stop the command (it raises there), so each
sees what the process would have handed TensorFlow; the real steps are in
test_slurm_real.py."""

import os

import pytest
from helpers.commands import run_in_process

from launch import cli
from launch.errors import BadInput

# Task 1 of a 2-task step on one node whose 4 GPUs every task sees (srun --gres=gpu:4).
STEP = {"SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": "vm", "SLURM_STEP_TASKS_PER_NODE": "2",
        "SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "1", "SLURM_NODEID": "0",
        "SLURM_LOCALID": "1", "CUDA_VISIBLE_DEVICES": "0,1,2,3", "SLURM_GPUS_ON_NODE": "4"}


@pytest.fixture
def tensorflow_sees(monkeypatch) -> list:
    """CUDA_VISIBLE_DEVICES as TensorFlow would have found it, once the command starts it."""
    seen = []

    def start():
        seen.append(os.environ.get("CUDA_VISIBLE_DEVICES"))
        raise BadInput("stopped where TensorFlow starts")

    monkeypatch.setattr(cli, "_start_tensorflow", start)
    return seen


@pytest.fixture
def in_step(monkeypatch):
    for name, value in STEP.items():
        monkeypatch.setenv(name, value)


def test_a_worker_has_its_share_of_the_nodes_gpus_before_tensorflow_starts(in_step,
                                                                          tensorflow_sees):
    result = run_in_process("train")
    assert tensorflow_sees == ["2,3"]
    assert 'worker 1: CUDA_VISIBLE_DEVICES="2,3", its share of the node\'s GPUs 0,1,2,3' in (
        result.stderr)


def test_in_process_keeps_every_task_one_process_with_the_gpus_slurm_gave(in_step,
                                                                         tensorflow_sees):
    run_in_process("train", "--set", "cluster.backend=in_process")
    assert tensorflow_sees == ["0,1,2,3"]


def test_horovod_ranks_are_not_a_steps_tasks(in_step, tensorflow_sees):
    result = run_in_process("train", "--backend", "horovod")
    assert result.returncode == 2 and tensorflow_sees == []
    assert ("cluster.backend: horovod runs as `towers train` ranks under horovodrun, not as a "
            "task of a Slurm step") in result.stderr


def test_a_cluster_arrangement_outside_a_launcher_says_where_it_runs(tensorflow_sees):
    result = run_in_process("train", "--set", "cluster.backend=collective")
    assert result.returncode == 2 and tensorflow_sees == []
    assert "this `towers train` is not a task of a Slurm step" in result.stderr
