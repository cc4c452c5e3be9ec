"""data.epochs: a training input that ends, so a job can stop when its data runs out."""

import pytest
import tensorflow as tf

from launch.config import from_dict
from launch.runtime.inputs import input_tensors
from launch.runtime.plan import make_plan


def batches_until_the_end(job, training=True, limit=100) -> int:
    plan = make_plan(job)
    features, _ = input_tensors(plan, training=training, batch_size=job.train.batch_size)
    count = 0
    with tf.compat.v1.Session() as sess:
        while count < limit:
            try:
                sess.run(features)
            except tf.errors.OutOfRangeError:
                return count
            count += 1
    return count


@pytest.mark.parametrize("epochs, batches", [(1, 3), (2, 6)])
def test_training_data_ends_after_its_epochs_in_full_batches(graph, epochs, batches):
    # 100 examples in batches of 32: three full batches an epoch, the remainder dropped.
    job = from_dict({"model": {"name": "mlp"}, "data": {"num_examples": 100, "epochs": epochs},
                     "train": {"batch_size": 32}})
    assert batches_until_the_end(job) == batches


def test_without_epochs_training_data_repeats(graph):
    job = from_dict({"model": {"name": "mlp"}, "data": {"num_examples": 100},
                     "train": {"batch_size": 32}})
    assert batches_until_the_end(job, limit=20) == 20
