"""The order of the training examples: each epoch a function of (data.seed, epoch) alone,
the same from any position on and for any number of readers, which take disjoint parts
of every global batch that together are the batch one reader takes."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import tensorflow as tf
from helpers.sessions import quick_session

from launch.config import from_dict
from launch.data import source_of
from launch.data.converters.writer import example, float_feature, int64_feature
from launch.data.order import EpochOrder
from launch.data.position import BatchPart
from launch.data.record_order import RecordOrder, round_robin
from models import InputSpec

SPEC = InputSpec((1,), tf.float32, (), tf.int32, 2)
COUNTS = (7, 3, 12, 5, 9)  # records of each file: uneven, so files end mid-round


def write_numbered(directory, counts=COUNTS) -> str:
    """TFRecord files whose record i of file f holds the feature f * 1000 + i."""
    for f, count in enumerate(counts):
        with tf.io.TFRecordWriter(str(directory / f"part-{f}.tfrecord")) as out:
            for i in range(count):
                out.write(example({"features": float_feature([f * 1000 + i]),
                                   "label": int64_feature([i % 2])}))
    return str(directory / "part-*.tfrecord")


def numbered_npz(directory, count=23) -> str:
    path = directory / "d.npz"
    np.savez(path, features=np.arange(count, dtype=np.float32)[:, None],
             labels=np.arange(count) % 2)
    return str(path)


def source(data: dict):
    return source_of(from_dict({"data": data}).data)


def read(src, part: BatchPart, start: int, batches: int) -> list[tuple[list, list]]:
    """(positions, example ids) of each batch ``part`` takes from position ``start``."""
    with tf.Graph().as_default():
        dataset = src.training_dataset(SPEC, part, start, batches)
        features, _, positions = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
        got = []
        with quick_session() as sess:
            for _ in range(batches):
                x, p = sess.run([features, positions])
                got.append((p.tolist(), x[:, 0].astype(int).tolist()))
            with pytest.raises(tf.errors.OutOfRangeError):
                sess.run(positions)
    return got


def flat_ids(batches) -> list[int]:
    return [i for _, ids in batches for i in ids]


# ------------------------------------------------------------------- in memory


def test_every_epoch_is_a_permutation_of_its_own():
    order = EpochOrder(50, seed=3)
    epochs = [order.examples(np.arange(e * 50, (e + 1) * 50)) for e in range(3)]
    assert all(sorted(e.tolist()) == list(range(50)) for e in epochs)
    assert not np.array_equal(epochs[0], epochs[1])
    # a function of (seed, epoch) alone: another object, epochs asked in another order
    again = EpochOrder(50, seed=3)
    assert np.array_equal(again.examples(np.arange(100, 150)), epochs[2])
    assert np.array_equal(again.examples(np.arange(45, 55)),
                          np.concatenate([epochs[0][45:], epochs[1][:5]]))
    assert not np.array_equal(EpochOrder(50, seed=4).examples(np.arange(50)), epochs[0])
    assert EpochOrder(50, 3, shuffle=False).examples(np.arange(48, 52)).tolist() == [
        48, 49, 0, 1]


@pytest.mark.parametrize("readers", [2, 3])
def test_readers_of_held_data_split_each_global_batch(tmp_path, readers):
    src = source({"source": "npz", "path": numbered_npz(tmp_path)})
    one = read(src, BatchPart.of(8), 20, 6)  # from inside the first epoch into the third
    parts = [read(src, BatchPart.of(8, i, readers), 20, 6) for i in range(readers)]
    for step, (positions, ids) in enumerate(one):
        assert positions == list(range(20 + 8 * step, 28 + 8 * step))
        assert sum((part[step][1] for part in parts), []) == ids
    epoch = flat_ids(read(src, BatchPart.of(23), 23, 1))
    assert sorted(epoch) == list(range(23))  # the second epoch, whole


# ------------------------------------------------------------------- TFRecord files


@pytest.mark.parametrize("seed", range(40))
def test_round_robin_after_any_record_matches_reading_it(seed):
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 6, rng.integers(1, 6))
    turns = [f for r in range(max(counts, default=0)) for f in range(len(counts))
             if counts[f] > r]
    taken = int(rng.integers(0, len(turns) + 1))
    read_counts, order = round_robin(counts, taken)
    assert read_counts.tolist() == [turns[:taken].count(f) for f in range(len(counts))]
    # the files with records left, in the order the rest of the round robin takes them
    assert order.tolist() == list(dict.fromkeys(turns[taken:]))


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    return write_numbered(tmp_path_factory.mktemp("numbered"))


@pytest.mark.parametrize("window", [0, 4, 10])
def test_every_tfrecord_epoch_is_a_permutation_and_starts_anywhere(records, window):
    total = sum(COUNTS)  # 36
    src = source({"source": "tfrecord", "path": records, "shuffle_buffer": window})
    whole = flat_ids(read(src, BatchPart.of(1), 0, 3 * total))
    epochs = [whole[e * total:(e + 1) * total] for e in range(3)]
    every = sorted(f * 1000 + i for f, count in enumerate(COUNTS) for i in range(count))
    assert all(sorted(e) == every for e in epochs)
    if window:
        assert epochs[0] != epochs[1]  # the files, and the windows, permuted afresh
    else:
        assert epochs[0] == epochs[1] == every  # in their order, file after file
    for start in (1, 5, 13, 35, 36, 50):  # mid-window, mid-group, at and past an epoch
        assert flat_ids(read(src, BatchPart.of(1), start, 20)) == whole[start:start + 20]


def test_tfrecord_readers_split_each_global_batch(records):
    src = source({"source": "tfrecord", "path": records, "shuffle_buffer": 8})
    one = read(src, BatchPart.of(10), 17, 5)
    parts = [read(src, BatchPart.of(10, i, 3), 17, 5) for i in range(3)]
    for step, (positions, ids) in enumerate(one):
        assert [p for part in parts for p in part[step][0]] == positions
        assert [i for part in parts for i in part[step][1]] == ids


def test_a_window_moves_a_record_only_within_it(records):
    window = 6
    src = source({"source": "tfrecord", "path": records, "shuffle_buffer": window})
    shuffled = flat_ids(read(src, BatchPart.of(1), 0, sum(COUNTS)))
    assert any(a > b for a, b in itertools.pairwise(shuffled))
    # within a group (16 files: all five here), windows of 6 records of the round robin
    files = RecordOrder(src.index(), 0, window).groups(0)[0]
    turns = [int(f) * 1000 + r for r in range(max(COUNTS)) for f in files if COUNTS[f] > r]
    for w in range(0, len(turns), window):
        assert sorted(shuffled[w:w + window]) == sorted(turns[w:w + window])


@pytest.mark.parametrize("window", [0, 50])
def test_each_record_is_named_by_its_file_and_index_past_a_reads_first_block(tmp_path, window):
    """The (position, origin, record) stream: origin names the record's file and index
    (what a bad record's message names), also past the records of a file numbered at
    once, from any start; positions count on by one."""
    from launch.data.record_stream import ordered_records
    from launch.data.stream import ORIGIN_FILE, Pipeline

    src = source({"source": "tfrecord", "path": write_numbered(tmp_path, (150, 70)),
                  "shuffle_buffer": window})
    order = RecordOrder(src.index(), 0, window)
    for start in (0, 97):
        with tf.Graph().as_default():
            stream = ordered_records(order, tf.constant(start, tf.int64),
                                     Pipeline(1, window, 1, 1, 0, True, True))
            position, origin, record = tf.compat.v1.data.make_one_shot_iterator(
                stream.take(220 - start)).get_next()
            parsed = tf.io.parse_single_example(
                record, {"features": tf.io.FixedLenFeature([1], tf.float32)})["features"]
            seen = []
            with quick_session() as sess:
                for _ in range(220 - start):
                    seen.append(sess.run([position, origin, parsed]))
        assert [int(p) for p, _, _ in seen] == list(range(start, 220))
        for _, o, value in seen:
            assert (o // ORIGIN_FILE) * 1000 + o % ORIGIN_FILE == int(value[0])
