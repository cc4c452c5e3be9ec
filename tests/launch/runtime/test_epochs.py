"""data.epochs: the step at which the data's passes end, and a training input started
anywhere that gives exactly the batches up to it."""

import numpy as np
import pytest
import tensorflow as tf

from launch.config import from_dict
from launch.data.position import DataProgress
from launch.runtime.inputs import training_input
from launch.runtime.plan import make_plan


def job_of(examples: int, batch: int, epochs: int | None = None):
    return from_dict({"model": {"name": "mlp"},
                      "data": {"num_examples": examples, "epochs": epochs},
                      "train": {"batch_size": batch}})


def batches_from(job, start: int, batches: int | None, limit: int = 100) -> list[np.ndarray]:
    """The positions of every batch the input gives from ``start``, up to ``limit``."""
    feed = training_input(make_plan(job), job.train.batch_size)
    got = []
    with tf.compat.v1.Session() as sess:
        feed.begin(sess, start, batches)
        while len(got) < limit:
            try:
                got.append(sess.run(feed.positions))
            except tf.errors.OutOfRangeError:
                break
    return got


@pytest.mark.parametrize("epochs, end", [(1, 3), (2, 6), (3, 9)])
def test_the_passes_end_at_the_last_whole_batch_of_the_epochs_laid_end_to_end(epochs, end):
    # 100 examples, batches of 32: the epochs laid end to end give 3, 6 and 9 whole batches
    assert DataProgress(0, 0, 32, 100).end_step(epochs) == end
    assert DataProgress(0, 0, 32, 100).end_step(None) is None


def test_a_resumed_job_ends_where_one_never_stopped_ends():
    straight = DataProgress(0, 0, 20, 17970)
    assert straight.end_step(1) == 898  # as the 1,797 digits tiled 10x do
    resumed = straight.at(395, 20)  # stopped at step 395 and resumed
    assert resumed.end_step(1) == 898 and resumed.position(395) == 7900
    # another batch size from step 395 on: the same example next, the end where it falls
    assert straight.at(395, 40).end_step(1) == 395 + (17970 - 7900) // 40


def test_an_input_started_anywhere_gives_the_batches_it_is_asked_for(graph):
    job = job_of(100, 32, epochs=2)
    got = batches_from(job, start=96, batches=3)  # positions 96 .. 191: steps 3, 4, 5
    assert [b.tolist() for b in got] == [list(range(96 + 32 * k, 128 + 32 * k))
                                         for k in range(3)]


def test_without_an_end_the_training_input_goes_on(graph):
    assert len(batches_from(job_of(100, 32), start=0, batches=None, limit=20)) == 20
