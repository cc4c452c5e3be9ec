"""data.epochs: the step at which the data's passes end, and a training input started
anywhere that gives exactly the batches up to it."""

import time

import numpy as np
import pytest
import tensorflow as tf

from launch.config import from_dict
from launch.data.position import DataProgress
from launch.runtime.hooks import LastStep
from launch.runtime.inputs import training_input
from launch.runtime.plan import make_plan
from launch.runtime.progress import ProgressHook

V1 = tf.compat.v1


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


def test_the_progress_line_counts_to_and_times_the_end_of_the_data(graph):
    """train.steps 1000, the data's passes end at step 10: the line counts to 10, and
    its ETA is the 5 steps left at the pace so far (0.2 s a step), not 995."""
    step = V1.train.get_or_create_global_step()
    slow = tf.py_function(lambda: time.sleep(0.2) or 1.0, [], tf.float32)
    with tf.control_dependencies([slow]):
        train_op = V1.assign_add(step, 1)
    lines = []
    last = LastStep(1000, data_end=10)
    progress = ProgressHook({"loss": slow}, step, 16, last, 5, None, lines.append)
    with V1.train.MonitoredSession(hooks=[progress]) as sess:
        for _ in range(5):
            sess.run(train_op)
    line, = [line for line in lines if line.startswith("step 5/10 ")]
    minutes, seconds = line.split(" eta=")[1].split()[0].split(":")
    assert int(minutes) == 0 and int(seconds) < 10, line  # about 1 s; 995 steps: 3:19
