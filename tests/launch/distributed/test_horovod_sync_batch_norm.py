"""Synchronized batch norm across Horovod ranks: 2 ranks of 2 towers normalize by the
whole global batch, so they train as one device on it (one horovodrun). The model is
the built-in ResNet's code at depth 8 (tests/helpers/small_resnet.py): each of its batch
norms is synchronized as resnet20's are, in a third of the graph every rank builds."""

import shutil

import numpy as np
import pytest
from helpers.checkpoints import checkpoint_variables
from helpers.commands import HELPERS, ok, run_in_process
from helpers.horovod import needs_horovod
from test_horovod import horovodrun, rank_results

RESNET = ["--set", "model.name=small_resnet:build",
          "--set", f"model.path={HELPERS}",
          "--set", "data.num_examples=256", "--set", "data.shuffle_buffer=0",
          "--set", "optimizer.name=momentum", "--set", "train.batch_size=12",
          "--set", "train.log_every_steps=1"]


@pytest.mark.e2e
@needs_horovod
def test_two_ranks_of_sync_towers_train_like_one_device_on_the_whole_batch(tmp_path):
    # Both runs resume from one checkpoint of one step, so they start alike.
    start, single, ranks = tmp_path / "start", tmp_path / "single", tmp_path / "ranks"
    ok(run_in_process("train", *RESNET, "--set", f"train.checkpoint_dir={start}",
                      "--set", "train.steps=1", "--set", "towers.devices=1"))
    shutil.copytree(start, single)
    shutil.copytree(start, ranks)
    ok(run_in_process("train", *RESNET, "--set", f"train.checkpoint_dir={single}",
                      "--set", "train.steps=3", "--set", "towers.devices=1"))
    result = horovodrun(2, "train", *RESNET, "--set", f"train.checkpoint_dir={ranks}",
                        "--set", "train.steps=3", "--set", "towers.devices=2",
                        "--set", "towers.batch_norm=sync", "--backend", "horovod")
    assert result.returncode == 0, result.stderr[-3000:]
    assert [r["global_step"] for r in rank_results(result.stdout).values()] == [3, 3]

    expected = checkpoint_variables(single, "resnet8/")
    got = checkpoint_variables(ranks, "resnet8/")
    assert expected.keys() == got.keys()
    moving = [n for n in expected if "moving" in n]
    assert moving  # 6 examples a rank, 3 a tower: each alone would give other statistics
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, atol=1e-5, rtol=0, err_msg=name)
    initial = checkpoint_variables(start, "resnet8/")
    assert any(not np.allclose(initial[n], expected[n]) for n in moving), "nothing trained"
