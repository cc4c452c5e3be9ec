"""What a training run says it did: a resumed run names where it resumed, a finished job
run again takes no step and says so, and a run that ends with its data says why.
Whole `towers train` jobs, run in this process."""

import os

import numpy as np

from launch.config import from_dict
from launch.runtime.train import train


def run(ckpt, steps, lines, data=None, **train_keys):
    job = from_dict({
        "model": {"name": "mlp", "input_dim": 8, "hidden_units": [8], "num_classes": 2},
        "data": data or {"source": "synthetic", "num_examples": 64},
        "towers": {"devices": 2},
        "train": {"batch_size": 16, "steps": steps, "log_every_steps": 5,
                  "checkpoint_dir": str(ckpt), **train_keys},
    })
    return train(job, write=lines.append)


def checkpoint_files(ckpt) -> dict[str, float]:
    """Every checkpoint file (events files aside) and when it was last written."""
    return {name: os.stat(ckpt / name).st_mtime_ns for name in os.listdir(ckpt)
            if "tfevents" not in name}


def test_a_finished_job_run_again_takes_no_step_and_leaves_its_checkpoints(tmp_path):
    ckpt, first = tmp_path / "ckpt", []
    done = run(ckpt, 10, first)
    assert done["global_step"] == 10 and done["steps_run"] == 10
    before = checkpoint_files(ckpt)
    for _ in range(2):  # a second run used to take step 11, a third step 12
        lines = []
        again = run(ckpt, 10, lines)
        assert again["global_step"] == 10 and again["steps_run"] == 0, again
        assert again["checkpoint"].endswith("model.ckpt-10")
        assert "loss" not in again  # no step, so no loss to report
        assert "at step 10 already, train.steps is 10: no step to take" in lines
        assert not [line for line in lines if line.startswith(("step ", "saved checkpoint"))]
        assert checkpoint_files(ckpt) == before


def test_a_resumed_run_says_where_it_resumed(tmp_path):
    ckpt = tmp_path / "ckpt"
    run(ckpt, 5, [])
    lines = []
    assert run(ckpt, 8, lines)["steps_run"] == 3
    # 5 steps of 16 examples of 64: the 80th example, the 16th of the second pass
    assert f"resuming from {ckpt}/model.ckpt-5 at step 5: epoch 2, example 16 of 64" in lines
    assert not [line for line in lines if line.startswith("resuming")][1:]


def test_a_run_that_ends_with_its_data_says_why(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "d.npz"
    np.savez(path, features=rng.normal(size=(40, 8)).astype(np.float32),
             labels=rng.integers(0, 2, size=40))
    lines = []
    ended = run(tmp_path / "ckpt", 100, lines, {"source": "npz", "path": str(path),
                                                 "epochs": 2})
    assert ended["stopped_by"] == "end of data"
    # 2 passes over 40 examples laid end to end: 5 batches of 16
    assert ended["global_step"] == 5 and ended["epoch"] == 2.0
    assert ended["examples_trained"] == 80
    assert ("data.epochs: 2 pass(es) over the data done at step 5 (train.steps 100); "
            "training ends there") in lines
