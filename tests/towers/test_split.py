"""Splitting a global batch into tower shards."""

import numpy as np
import pytest
import tensorflow as tf
from helpers.tower_training import cpus, momentum, tiny_classifier

import towers


def test_shard_sizes_differ_by_at_most_one_larger_first():
    assert towers.shard_sizes(10, 4) == [3, 3, 2, 2]
    assert towers.shard_sizes(8, 4) == [2, 2, 2, 2]
    assert towers.shard_sizes(3, 3) == [1, 1, 1]


@pytest.mark.parametrize("processes", [1, 2, 3])
@pytest.mark.parametrize("micro_batches", [1, 2, 3])
@pytest.mark.parametrize("num_towers", [1, 2, 4])
def test_batch_shortfall_is_whether_the_smallest_piece_is_empty(num_towers, micro_batches,
                                                                processes):
    """Processes' shards, cut into micro-batches, split across towers: the rule in one line."""
    for batch in range(1, 40):
        smallest = min(
            piece
            for share in towers.shard_sizes(batch, processes)
            for micro in towers.shard_sizes(share, micro_batches)
            for piece in towers.shard_sizes(micro, num_towers)
        )
        shortfall = towers.batch_shortfall(batch, num_towers, micro_batches, processes)
        assert (shortfall is None) == (smallest >= 1), (batch, shortfall)


def test_batch_shortfall_says_what_every_tower_needs():
    assert towers.batch_shortfall(2, 4) == (
        "a global batch of 2 examples cannot give each of 4 towers at least one example; "
        "it needs at least 4")
    assert towers.batch_shortfall(6, 1, 4, processes=2) == (
        "a global batch of 6 examples cannot give the one tower in each of 2 processes at "
        "least one example of each of 4 micro-batches; it needs at least 8")


def test_split_keeps_every_example_in_order(graph):
    x = tf.constant(np.arange(20, dtype=np.float32).reshape(10, 2))
    feats = {"a": x, "b": tf.constant(np.arange(10))}
    shards = towers.split_batch(feats, tf.constant(np.arange(10, dtype=np.int32)), 4)
    with tf.compat.v1.Session() as sess:
        got = sess.run([(s.features["b"], s.labels, s.num_examples) for s in shards])
    assert [len(b) for b, _, _ in got] == [3, 3, 2, 2]
    assert [n for _, _, n in got] == [3, 3, 2, 2]
    assert np.concatenate([lab for _, lab, _ in got]).tolist() == list(range(10))


def test_split_of_dynamic_batch_happens_at_run_time(graph):
    x = tf.compat.v1.placeholder(tf.float32, [None, 2])
    y = tf.compat.v1.placeholder(tf.int32, [None])
    shards = towers.split_batch(x, y, 3)
    with tf.compat.v1.Session() as sess:
        counts = sess.run([s.num_examples for s in shards], {x: np.zeros((7, 2)), y: np.zeros(7)})
        assert counts == [3, 2, 2]
        # One line of ours, without assert_greater_equal's condition and tensor names.
        too_small = (r"assertion failed: \[a global batch of 2 examples cannot give each of 3 "
                     r"towers at least one example; it needs at least 3\]\n")
        with pytest.raises(tf.errors.InvalidArgumentError, match=too_small):
            sess.run(shards[0].labels, {x: np.zeros((2, 2)), y: np.zeros(2)})


def test_static_batch_smaller_than_towers_is_a_build_time_error(graph):
    x, y = tf.zeros([3, 4]), tf.zeros([3], tf.int32)
    with pytest.raises(ValueError, match="a global batch of 3 examples cannot give each of 4 "
                                         "towers at least one example; it needs at least 4"):
        towers.build_train_op(tiny_classifier, x, y, momentum(), cpus(4))


def test_features_and_labels_must_agree_on_batch_size(graph):
    with pytest.raises(ValueError, match="disagree on the batch size"):
        towers.split_batch(tf.zeros([8, 4]), tf.zeros([6], tf.int32), 2)
