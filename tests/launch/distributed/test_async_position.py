"""Asynchronous ps/worker jobs resume exactly: each worker's position in the data is held
with the variables on the ps (launch.runtime.worker_positions), its input starts there,
and with data.epochs each worker trains its own parts of every global batch of the
passes before the job ends. The arithmetic in this process; one real cluster, killed
after a checkpoint and started again, counts how often each example was trained."""

import re

import numpy as np
import pytest
import tensorflow as tf
from helpers.commands import HELPERS, Cluster, last_json

from launch.data.position import batches_left, positions_trained, resumed_positions

V1 = tf.compat.v1


# --- the arithmetic --------------------------------------------------------------------

def test_the_same_number_of_workers_go_on_each_at_its_own_position():
    assert resumed_positions([480, 504], 0, 2) == [480, 504]


@pytest.mark.parametrize("workers", [1, 3])
def test_another_number_of_workers_start_together_at_the_lowest(workers):
    assert resumed_positions([480, 528], 0, workers) == [480] * workers


def test_a_checkpoint_without_positions_starts_every_worker_at_its_data_position():
    assert resumed_positions(None, 456, 3) == [456, 456, 456]


def test_the_examples_trained_are_the_batches_before_the_lowest_and_each_part_beyond():
    # global batches of 24, parts of 12 + 12: worker 1 is two batches ahead
    assert positions_trained([480, 528], [12, 12], 24) == 480 + 2 * 12
    assert positions_trained([480, 480], [12, 12], 24) == 480
    assert positions_trained([24, 0, 48], [8, 8, 8], 24) == 0 + 8 + 16


def test_each_worker_has_the_whole_global_batches_left_from_its_own_position():
    # 100 examples, global batches of 24: 4 whole ones a pass, the last 4 examples left out
    assert [batches_left(p, 1, 100, 24) for p in (0, 48, 72, 96)] == [4, 2, 1, 0]
    assert batches_left(96, 2, 100, 24) == 4  # on into the second pass


# --- one cluster, killed after a checkpoint and started again ---------------------------

ROWS, BATCH, RATE = 1920, 24, 0.125  # 80 global batches; a power of 2: exact counts


def job_args(data):
    settings = {
        "model.name": "counting_model:build", "model.path": HELPERS, "model.rows": ROWS,
        "model.delay_secs": 0.02, "model.input_dim": 8, "model.num_classes": 2,
        "model.hidden_units": "[8]", "data.source": "npz", "data.path": data,
        "data.epochs": 1, "train.batch_size": BATCH, "train.steps": 100000,
        "train.sync": "false", "train.checkpoint_every_steps": 20,
        "train.log_every_steps": 20, "optimizer.name": "sgd",
        "optimizer.learning_rate": RATE, "towers.devices": 1, "metrics.port": "null",
        "cluster.startup_timeout_secs": 60}
    return [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]


@pytest.mark.e2e
def test_workers_killed_after_a_checkpoint_and_restarted_train_each_example_once(tmp_path):
    """Both workers killed (SIGKILL) after a checkpoint and started again: the chief
    restores the checkpoint onto the ps, as after a whole cluster's restart (the ps
    lives on only to save a process start). Every example of the pass trained, none
    more than twice (those applied while the checkpoint was saved)."""
    rng = np.random.default_rng(0)
    data = tmp_path / "rows.npz"
    np.savez(data, features=rng.normal(size=(ROWS, 8)).astype(np.float32),
             labels=rng.integers(0, 2, size=ROWS))
    cluster = Cluster(tmp_path, job_args(data), workers=2)
    try:
        cluster.start("ps", "ps", 0)
        chief = cluster.start("worker0", "worker", 0)
        cluster.start("worker1", "worker", 1)
        chief.wait_for(r"saved checkpoint at step [1-9]\d*")
        cluster.kill("worker0")
        cluster.kill("worker1")
        chief = cluster.start("worker0-again", "worker", 0)
        cluster.start("worker1-again", "worker", 1)
        cluster.finish()
    finally:
        cluster.stop()
    resumed = re.search(r"resuming from \S+ at step \d+: .*", chief.stderr)
    assert resumed and "worker positions" in resumed.group(0), chief.stderr[-3000:]
    result = last_json(chief.stdout)
    assert result["stopped_by"] == "end of data"
    assert result["examples_trained"] == ROWS and result["epoch"] == 1.0
    latest = tf.train.latest_checkpoint(str(cluster.ckpt))
    times = tf.train.load_variable(latest, "mlp_counts/trained") / RATE
    print(resumed.group(0), "; examples trained twice:", int((times == 2).sum()))
    np.testing.assert_array_equal(times, np.round(times))
    assert times.min() == 1  # none skipped
    assert times.max() <= 2
