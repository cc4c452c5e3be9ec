"""A resumed job is the job that never stopped: it continues at the next example, with
the same dropout masks, ends at the step where the straight run ends, and once its
passes are done a further run takes no step. Whole `towers train` jobs in this process,
on 200 rows (2 passes of 16-example steps: the data ends at step 25)."""

import numpy as np
import pytest
import tensorflow as tf
from helpers.checkpoints import checkpoint_variables

from launch.config import from_dict
from launch.data.order import EpochOrder
from launch.runtime.inputs import training_input
from launch.runtime.plan import make_plan
from launch.runtime.train import train

ROWS, BATCH, EPOCHS = 200, 16, 2
END = EPOCHS * ROWS // BATCH  # 25: the last whole batch of the two passes


@pytest.fixture(scope="module")
def data_path(tmp_path_factory):
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("data") / "rows.npz"
    np.savez(path, features=rng.normal(size=(ROWS, 8)).astype(np.float32),
             labels=rng.integers(0, 2, size=ROWS))
    return path


def job(data_path, ckpt, steps, devices=2):
    return from_dict({
        "model": {"name": "mlp", "input_dim": 8, "hidden_units": [16], "num_classes": 2,
                  "dropout": 0.3},
        "data": {"source": "npz", "path": str(data_path), "epochs": EPOCHS, "seed": 3},
        "towers": {"devices": devices},
        "train": {"batch_size": BATCH, "steps": steps, "log_every_steps": 100,
                  "checkpoint_dir": str(ckpt)},
    })


def run_in_stops(data_path, ckpt, stops, devices=(2,)):
    """Train to each step of ``stops`` in turn (a job stopped there and run again), the
    i-th run on devices[i] towers (the last count for the rest); the runs' results."""
    results = []
    for i, steps in enumerate(stops):
        lines = []
        towers = devices[min(i, len(devices) - 1)]
        results.append((train(job(data_path, ckpt, steps, towers), write=lines.append), lines))
    return results


@pytest.fixture(scope="module")
def straight(data_path, tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("straight")
    (result, _), = run_in_stops(data_path, ckpt, [1000])
    return result, checkpoint_variables(ckpt)


def assert_same_weights(ckpt, expected, atol=1e-5):
    got = checkpoint_variables(ckpt)
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, atol=atol, rtol=0, err_msg=name)


def test_the_straight_run_ends_with_its_passes(straight):
    result, _ = straight
    assert result["stopped_by"] == "end of data"
    assert result["global_step"] == END and result["steps_run"] == END
    assert result["epoch"] == 2.0 and result["examples_trained"] == END * BATCH


def test_stopped_twice_mid_epoch_and_run_again_it_ends_where_the_straight_run_ends(
        data_path, tmp_path, straight):
    ckpt = tmp_path / "ckpt"
    runs = run_in_stops(data_path, ckpt, [7, 19, 1000, 1000])
    (_, _), (_, second), (ended, _), (again, again_lines) = runs
    # 7 steps of 16: position 112, in the first pass
    assert f"resuming from {ckpt}/model.ckpt-7 at step 7: epoch 1 of 2, example 112 of 200" \
        in second
    assert ended["global_step"] == END and ended["stopped_by"] == "end of data"
    assert ended["steps_run"] == END - 19
    assert_same_weights(ckpt, straight[1])
    # done: a further run takes no step and says why
    assert again["steps_run"] == 0 and again["global_step"] == END
    assert (f"at step {END} already, where the data's 2 pass(es) end (data.epochs): "
            "no step to take") in again_lines


def test_resumed_on_another_number_of_towers_it_trains_the_same_examples(
        data_path, tmp_path, straight):
    ckpt = tmp_path / "ckpt"
    *_, (ended, _) = run_in_stops(data_path, ckpt, [7, 1000], devices=(2, 1))
    assert ended["global_step"] == END
    # One tower sums the batch in another order than two: a float32 rounding apart.
    assert_same_weights(ckpt, straight[1], atol=1e-5)


def test_through_three_restarts_each_example_is_trained_once_an_epoch(data_path, graph):
    """The positions the input gives from each restart's step to the next stop, as the
    session's start begins it there: every example once in each pass, none twice."""
    cfg = job(data_path, "unused", 1000)
    feed = training_input(make_plan(cfg), BATCH)
    trained = []
    with tf.compat.v1.Session() as sess:
        for start, stop in [(0, 5), (5, 12), (12, 20), (20, END)]:
            feed.begin(sess, start * BATCH, stop - start)
            while True:
                try:
                    trained.extend(sess.run(feed.positions).tolist())
                except tf.errors.OutOfRangeError:
                    break
    positions = np.array(trained)
    assert positions.tolist() == list(range(END * BATCH))
    order = EpochOrder(ROWS, 3)
    examples = order.examples(positions)
    first, second = examples[:ROWS], examples[ROWS:]
    assert sorted(first.tolist()) == list(range(ROWS))  # each pass: each example once
    assert sorted(second.tolist()) == list(range(ROWS))
    assert (first != order.examples(np.arange(ROWS, 2 * ROWS))).any()  # a new order
