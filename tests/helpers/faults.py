"""A small job and poisoned data, shared by the fault tests of every mode (test_faults.py
for trainers and ps/worker clusters, test_horovod.py for Horovod ranks)."""

import os

import numpy as np
from helpers.diverging_model import MARK

BATCH = 16
SMALL = ["--set", "model.name=mlp", "--set", "model.input_dim=8", "--set", "model.num_classes=2",
         "--set", "model.hidden_units=[8]", "--set", f"train.batch_size={BATCH}",
         "--set", "train.log_every_steps=5", "--set", "data.source=synthetic"]


def job(ckpt, steps, every=10, *extra):
    return [*SMALL, "--set", f"train.checkpoint_dir={ckpt}", "--set", f"train.steps={steps}",
            "--set", f"train.checkpoint_every_steps={every}", *extra]


def diverging_model(*sizes: str) -> list[str]:
    """The job's model as tests/helpers/diverging_model.py (the mlp, whose gradient is
    NaN in a step whose batch holds a marked example); `sizes` are its model settings."""
    return ["--set", "model.name=diverging_model:build",
            "--set", f"model.path={os.path.dirname(__file__)}", *sizes]


def rows_with_dropout(path, rows=4000) -> list[str]:
    """Settings that make the small job train on ``rows`` npz rows in a seeded order,
    with dropout: what a resume must continue exactly (the data position, the masks)."""
    rng = np.random.default_rng(1)
    np.savez(path, features=rng.normal(size=(rows, 8)).astype(np.float32),
             labels=rng.integers(0, 2, size=rows))
    return ["--set", "data.source=npz", "--set", f"data.path={path}",
            "--set", "model.dropout=0.3"]


def poisoned_csv(path, bad_steps, rows=800):
    """CSV data, read in file order, whose batch for each of `bad_steps` (1-based) holds
    a marked example, and the model that diverges there (SMALL's sizes)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 8)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    for step in bad_steps:
        x[(step - 1) * BATCH + 3, 2] = MARK
    header = ",".join([f"f{i}" for i in range(8)] + ["label"])
    np.savetxt(path, np.concatenate([x, y[:, None]], axis=1), delimiter=",", header=header,
               comments="", fmt=["%.6f"] * 8 + ["%d"])
    return ["--set", "data.source=csv", "--set", f"data.path={path}",
            "--set", "data.shuffle_buffer=0",
            *diverging_model("--set", "model.input_dim=8", "--set", "model.num_classes=2",
                             "--set", "model.hidden_units=[8]")]
