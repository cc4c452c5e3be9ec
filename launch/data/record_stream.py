"""A TFRecord source's training records in the order of launch.data.record_order, from
any position on, and a reader's part of each global batch of them.

Each group of files is opened at the byte offsets its plan gives (TensorFlow's
TFRecordDatasetV2 reads from an offset), read round robin by a deterministic
interleave, cut into windows that are permuted (stateless, from the group's key and
the window's number), numbered with their positions, and the records before the
wanted position skipped. Records are numbered (origins, positions) a block or a window
at a time, never one by one: a tf.data step per record cost more than the rest of
reading a pre-decoded record (BENCHMARKS.md). Every reader reads every record and
keeps its own part of each global batch before parsing: parsing, decoding and
augmenting are split between the readers, reading is not (BENCHMARKS.md measures what
it costs).
"""

from __future__ import annotations

import tensorflow as tf

from launch.data.position import BatchPart
from launch.data.record_order import GROUP_FILES, RecordOrder
from launch.data.stream import AUTOTUNE, ORIGIN_FILE, Pipeline

READ_BUFFER_BYTES = 256 << 10  # TFRecordDataset's default read buffer
_WINDOW_SALT = 2
_READ_BLOCK = 64  # records of a file numbered at once


def ordered_records(order: RecordOrder, start: tf.Tensor, p: Pipeline) -> tf.data.Dataset:
    """(position, origin, record) of every record from position ``start`` (int64 scalar)
    on, epoch after epoch; origin = file index * ORIGIN_FILE + record index."""
    names = tf.constant(order.index.files)
    signature = (tf.TensorSpec([None], tf.int64),) * 3 + (tf.TensorSpec([], tf.int64),) * 4
    plans = tf.data.Dataset.from_generator(
        lambda first: (plan.as_tuple() for plan in order.plans(int(first))),
        output_signature=signature, args=(start,))
    calls = p.num_parallel_calls if p.num_parallel_calls == AUTOTUNE else min(
        p.num_parallel_calls, GROUP_FILES)

    def group(files, records, offsets, first_position, window, skip, key) -> tf.data.Dataset:
        def read(file: tf.Tensor, record: tf.Tensor, offset: tf.Tensor) -> tf.data.Dataset:
            origin = file * ORIGIN_FILE + record
            # Numbered a block of records at a time (one step per block, not per record).
            return _records_from(tf.gather(names, file), offset).batch(_READ_BLOCK).enumerate(
            ).map(lambda number, data: (
                origin + number * _READ_BLOCK + tf.range(tf.size(data, out_type=tf.int64)),
                data)).unbatch()

        pairs = tf.data.Dataset.from_tensor_slices((files, records, offsets)).interleave(
            read, cycle_length=GROUP_FILES, block_length=1, num_parallel_calls=calls,
            deterministic=True)
        # Numbered with their positions a block at a time (a window, permuted first,
        # when shuffling), one step per block rather than one per record: the cost of a
        # record pre-decoded is mostly such per-record steps.
        block = order.window if order.shuffle else _READ_BLOCK

        def numbered(number: tf.Tensor, batch: tuple[tf.Tensor, tf.Tensor]) -> tuple:
            if order.shuffle:
                batch = _permuted(batch, order.seed, key, window + number)
            count = tf.size(batch[0], out_type=tf.int64)
            return (first_position + number * block + tf.range(count), *batch)

        return pairs.batch(block).enumerate().map(numbered).prefetch(1).unbatch().skip(skip)

    return plans.flat_map(group)


def part_of_batches(records: tf.data.Dataset, part: BatchPart, start: tf.Tensor
                    ) -> tf.data.Dataset:
    """The records of ``part`` of each global batch, global batches starting at position
    ``start`` (records: (position, ...) tuples in position order)."""
    size, offset, global_batch = part.size, part.offset, part.global_batch
    if size == global_batch:
        return records

    def mine(position: tf.Tensor, *_) -> tf.Tensor:
        place = (position - start) % global_batch
        return (place >= offset) & (place < offset + size)

    return records.filter(mine)


def _records_from(name: tf.Tensor, offset: tf.Tensor) -> tf.data.Dataset:
    """The records of file ``name`` from byte ``offset`` on (a record's start)."""
    variant = tf.raw_ops.TFRecordDatasetV2(
        filenames=tf.reshape(name, [1]), compression_type="", buffer_size=READ_BUFFER_BYTES,
        byte_offsets=tf.reshape(offset, [1]))
    return tf.data.experimental.from_variant(variant, tf.TensorSpec([], tf.string))


def _permuted(window: tuple[tf.Tensor, tf.Tensor], seed: int, key: tf.Tensor,
              number: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """A window of (origins [n], records [n]) in the order drawn from (seed, key, number)."""
    origins, records = window
    draw_seed = tf.random.experimental.stateless_fold_in(
        tf.random.experimental.stateless_fold_in(tf.constant([seed, _WINDOW_SALT], tf.int64),
                                                 key), number)
    order = tf.argsort(tf.random.stateless_uniform(tf.shape(origins), draw_seed))
    return tf.gather(origins, order), tf.gather(records, order)
