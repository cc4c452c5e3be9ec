"""`towers validate` makes every start-up check `towers train` makes, so exit 0 means
train starts: on each job below, both commands answer alike, and validate writes nothing.
Both run in this process; train stops at its check, before any step."""

import os

import numpy as np
import pytest
import yaml
from helpers.commands import run_in_process

KERAS_12 = """
import keras


def build():
    inputs = keras.Input(shape=(12,))
    net = keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Dense(8)(inputs)))
    net.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return net


build.input_spec = {"feature_shape": [12], "num_classes": 3}
"""


def write_csv(path, columns: int, rows: int = 40) -> None:
    rng = np.random.default_rng(0)
    header = ",".join([f"f{i}" for i in range(columns)] + ["label"])
    lines = [",".join(f"{v:.3f}" for v in rng.normal(size=columns)) + f",{i % 3}"
             for i in range(rows)]
    path.write_text("\n".join([header, *lines]) + "\n")


MLP_12 = {"name": "mlp", "input_dim": 12, "num_classes": 3}
JOBS = {
    # the model's input width against the CSV's columns
    "mlp-784-on-12-columns": {"model": {**MLP_12, "input_dim": 784},
                              "data": {"source": "csv", "path": "twelve.csv"}},
    # a Keras model built for 12 features, on 11 (found only by building the graph)
    "keras-12-on-11-columns": {"model": {"name": "keras12:build"},
                               "data": {"source": "csv", "path": "eleven.csv"}},
    # data.path naming a directory with nothing in it
    "empty-directory": {"model": MLP_12, "data": {"source": "csv", "path": "empty"}},
    # a generated data set too large to hold (found without generating it)
    "builtin-of-300-gib": {"model": {**MLP_12, "input_dim": 784},
                           "data": {"source": "builtin", "num_examples": 10**8}},
    # the batch against the towers (auto: two here)
    "batch-of-one": {"model": MLP_12, "data": {"source": "csv", "path": "twelve.csv"},
                     "train": {"batch_size": 1}},
}


@pytest.fixture
def folder(tmp_path):
    write_csv(tmp_path / "twelve.csv", 12)
    write_csv(tmp_path / "eleven.csv", 11)
    (tmp_path / "empty").mkdir()
    (tmp_path / "keras12.py").write_text(KERAS_12)
    return tmp_path


def answer(folder, command: str, job: dict) -> tuple[int, list[str]]:
    """The exit status and the error lines of `towers COMMAND` on `job`."""
    train = {**job.get("train", {}), "checkpoint_dir": str(folder / "ckpt")}
    (folder / "job.yaml").write_text(yaml.safe_dump({**job, "train": train}))
    result = run_in_process(command, "-c", str(folder / "job.yaml"), cwd=str(folder))
    errors = [line for line in result.stderr.splitlines() if line.startswith("towers: error")]
    return result.returncode, errors


@pytest.mark.parametrize("name", JOBS)
def test_validate_refuses_what_train_refuses_and_writes_nothing(folder, name):
    validated = answer(folder, "validate", JOBS[name])
    assert not (folder / "ckpt").exists()  # validate wrote nothing
    trained = answer(folder, "train", JOBS[name])
    assert validated == trained
    code, errors = validated
    assert code == 2 and len(errors) == 1, validated


def test_a_job_validate_accepts_trains(folder):
    job = {"model": {**MLP_12, "hidden_units": [4]},
           "data": {"source": "csv", "path": "twelve.csv"},
           "train": {"batch_size": 8, "steps": 2}}
    assert answer(folder, "validate", job)[0] == 0
    assert not os.path.exists(folder / "ckpt")
    assert answer(folder, "train", job)[0] == 0


def test_validate_builds_the_graph_without_generating_the_built_in_data(folder, monkeypatch):
    """The built-in data set is made to the model's spec: validate checks the graph on
    synthetic batches of that spec (generating 20,000 examples took 1-3 s here, a large
    data.num_examples minutes), and train still generates it."""
    from launch.data.sources import builtin

    def generate(*args, **kwargs):
        raise AssertionError("the built-in data set was generated")

    monkeypatch.setattr(builtin, "builtin_arrays", generate)
    job = {"model": {**MLP_12, "input_dim": 784}, "data": {"source": "builtin"}}
    assert answer(folder, "validate", job)[0] == 0
    with pytest.raises(AssertionError, match="generated"):
        answer(folder, "train", job)
