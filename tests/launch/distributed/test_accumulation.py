"""Gradient accumulation in an asynchronous ps/worker job: micro-batches update exactly
as one process on the whole batch.

The reference runs in this process (`launch.runtime.train`) from the same start; the
job under test is a real `towers local-cluster` run on 127.0.0.1. Data is read in file
order (shuffle_buffer 0).
"""

import numpy as np
import pytest
from helpers.checkpoints import checkpoint_variables
from helpers.commands import ok, run_towers

from launch.config import from_dict
from launch.runtime.train import train

pytestmark = pytest.mark.e2e

JOB = {"model": {"name": "mlp", "hidden_units": [32]},
       "optimizer": {"name": "momentum", "learning_rate": 0.05},
       "data": {"num_examples": 512, "shuffle_buffer": 0},
       "train": {"batch_size": 64, "log_every_steps": 1}}


def flags(job: dict) -> list[str]:
    return [arg for section, values in job.items() for key, value in values.items()
            for arg in ("--set", f"{section}.{key}={value}")]


def train_here(ckpt, steps, **train_keys):
    """The reference: this process, one tower, no accumulation."""
    raw = {section: dict(values) for section, values in JOB.items()}
    raw["train"].update(checkpoint_dir=str(ckpt), steps=steps, **train_keys)
    raw["towers"] = {"devices": 1}
    return train(from_dict(raw), write=lambda line: None)


def assert_same_and_trained(expected, got, start):
    assert expected.keys() == got.keys() and expected
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, atol=1e-5, rtol=0, err_msg=name)
    assert any(not np.allclose(start[n], expected[n]) for n in expected), "nothing trained"


def test_an_asynchronous_ps_worker_job_accumulating_micro_batches_matches_one_process(tmp_path):
    """One worker, its variables on the ps, its towers' sums sent there, two steps.

    With two workers which gradients make an update would be a race. Horovod ranks and
    synchronous workers accumulating are checked where those jobs are
    (test_horovod.py, test_cluster.py), which start the same processes.
    """
    train_here(tmp_path / "start", 1)
    start = checkpoint_variables(tmp_path / "start", "mlp/")
    warm = str(tmp_path / "start")
    train_here(tmp_path / "single", 2, warm_start=warm)
    ok(run_towers("local-cluster", *flags(JOB), "--set", f"train.checkpoint_dir={tmp_path / 'c'}",
                  "--set", "train.steps=2", "--set", "train.sync=false",
                  "--set", "train.accumulate_steps=2", "--set", "towers.devices=2",
                  "--set", f"train.warm_start.path={warm}",
                  "--ps", "1", "--workers", "1", timeout=240))
    assert_same_and_trained(checkpoint_variables(tmp_path / "single", "mlp/"),
                            checkpoint_variables(tmp_path / "c", "mlp/"), start)
