"""The stages every file and array pipeline shares: options, sharding, file interleave,
shuffle/repeat/batch, and the two ways a batch gets parsed.

* ``batched``: records -> batch -> parse the whole batch in one parallel ``map``. Parsing
  stays vectorised (one ``parse_example``/``decode_csv``/gather per batch); the fast path.
* ``per_record``: records -> numbered -> parse each in a parallel ``map`` -> batch ->
  finish the batch. For what must be parsed one at a time (images of varying sizes),
  and for ``data.on_bad_record: skip``, where a record that fails is dropped on its own
  (``ignore_errors``) and counted from the gap in the numbers (``SkippedRecords``).

Both shuffle records before parsing, so the shuffle buffer holds small serialized
records (or indices), never decoded images.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import tensorflow as tf

from launch.data.errors import DataError
from launch.data.skips import SkippedRecords
from models import InputSpec

AUTOTUNE = tf.data.AUTOTUNE

# Files read at once by one pipeline: enough to mix shards and hide a slow read.
MAX_INTERLEAVE_FILES = 16

# (number, records) -> (features, labels): a batch's or a record's parse function.
Parse = Callable[[tf.Tensor, tf.Tensor], tuple[tf.Tensor, tf.Tensor]]
# (batch number, features, labels) -> (features, labels): the last stage of a batch.
Finish = Callable[[tf.Tensor, tf.Tensor, tf.Tensor], tuple[tf.Tensor, tf.Tensor]]


@dataclass(frozen=True)
class Pipeline:
    """The options shared by every source.

    shard: (index, count): this reader's part of the data. skipped: with
    ``on_bad_record: skip``, the counter of skipped records; None fails instead.
    """

    batch_size: int
    shuffle_buffer: int
    num_parallel_calls: int
    prefetch: int
    seed: int
    training: bool
    repeat: bool
    shard: tuple[int, int] = (0, 1)
    skipped: SkippedRecords | None = None

    @property
    def drop_remainder(self) -> bool:
        """Full, static-shape batches unless a finite eval stream must see every example."""
        return self.training or self.repeat


def autotune(value: int | str | None, name: str) -> int:
    """None or 'auto' -> tf.data.AUTOTUNE; otherwise a positive int."""
    if value is None or value == "auto" or value == AUTOTUNE:
        return AUTOTUNE
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DataError(f"{name} must be a positive int, 'auto' or None, got {value!r}")
    return value


def pipeline_options(threads: int | None) -> tf.data.Options:
    """The tf.data options of every pipeline; ``threads``: a private pool of that many
    threads (None: the shared inter-op pool)."""
    options = tf.data.Options()
    if threads is not None:
        options.threading.private_threadpool_size = threads
    return options


def files_of_shard(files: list[str], shard: tuple[int, int]) -> list[str] | None:
    """Reader i of n reads files i, i + n, ... when there are at least n files (no
    file is opened twice across the job); None when there are fewer: then every reader
    scans every file and keeps every n-th record, which costs reads, never data."""
    index, count = shard
    return files[index::count] if len(files) >= count else None


def shard_files(files: list[str], p: Pipeline) -> tuple[list[str], Pipeline]:
    """This reader's files, and the options left for its records (files_of_shard)."""
    mine = files_of_shard(files, p.shard) if p.shard[1] > 1 else None
    if mine is None:
        return files, p
    return mine, dataclasses.replace(p, shard=(0, 1))


def interleave_files(files: list[str], reader: Callable[[tf.Tensor], tf.data.Dataset],
                     p: Pipeline) -> tf.data.Dataset:
    """Read ``files`` in parallel (shuffled file order when training), one record each;
    evaluation reads them one after another, so its examples come in file order."""
    names = tf.data.Dataset.from_tensor_slices(files)
    if p.training:
        names = names.shuffle(len(files), seed=p.seed, reshuffle_each_iteration=True)
    cycle = min(len(files), MAX_INTERLEAVE_FILES) if p.training else 1
    calls = p.num_parallel_calls if p.num_parallel_calls == AUTOTUNE else min(
        p.num_parallel_calls, cycle)
    return names.interleave(reader, cycle_length=cycle, num_parallel_calls=calls)


def _shuffled(records: tf.data.Dataset, p: Pipeline, shuffle_buffer: int) -> tf.data.Dataset:
    """Record-level shard (when files could not be sharded), shuffle, repeat."""
    index, count = p.shard
    if count > 1:
        records = records.shard(count, index)
        shuffle_buffer = -(-shuffle_buffer // count)
    if p.training and shuffle_buffer > 1:
        records = records.shuffle(shuffle_buffer, seed=p.seed, reshuffle_each_iteration=True)
    if p.repeat:
        records = records.repeat()
    return records


def batched(records: tf.data.Dataset, p: Pipeline, shuffle_buffer: int,
            parse: Parse) -> tf.data.Dataset:
    """records: one element per example -> shuffle, repeat, batch, parse, prefetch.

    ``parse(number, records)`` maps the int64 number of a batch (a seed for batch-level
    randomness) and its records [B] to features [B, *feature_shape] and labels
    [B, *label_shape].
    """
    batches = _shuffled(records, p, shuffle_buffer).batch(p.batch_size,
                                                          drop_remainder=p.drop_remainder)
    batches = batches.enumerate().map(parse, num_parallel_calls=p.num_parallel_calls)
    return batches.prefetch(p.prefetch)


def per_record(records: tf.data.Dataset, p: Pipeline, shuffle_buffer: int,
               parse_one: Parse, finish: Finish) -> tf.data.Dataset:
    """records -> shuffle, repeat -> parse each -> batch -> finish -> prefetch.

    parse_one(number, record): number is the record's int64 position in the stream
    (a seed for per-example randomness); gives one example's features and labels.
    finish(number, features [B, ...], labels [B, ...]): number is the batch's; gives
    the final batch. With ``p.skipped`` a record whose parse_one raises is skipped and
    counted.
    """
    numbered = _shuffled(records, p, shuffle_buffer).enumerate()
    skip = p.skipped is not None

    def parse(number: tf.Tensor, record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        return (*parse_one(number, record), number)

    # Skipping finds dropped records as gaps in the numbers, so their order must hold.
    examples = numbered.map(parse, num_parallel_calls=p.num_parallel_calls,
                            deterministic=True if skip else None)
    if skip:
        examples = examples.ignore_errors()
    batches = examples.batch(p.batch_size, drop_remainder=p.drop_remainder)
    if skip:
        batches = batches.map(_counted(p.skipped))  # sequential: gaps counted in order

    def finish_numbered(number: tf.Tensor, batch: tuple) -> tuple[tf.Tensor, tf.Tensor]:
        features, labels, _ = batch
        return finish(number, features, labels)

    batches = batches.enumerate().map(finish_numbered, num_parallel_calls=p.num_parallel_calls)
    return batches.prefetch(p.prefetch)


def _counted(skipped: SkippedRecords) -> Callable:
    def count(features: tf.Tensor, labels: tf.Tensor, numbers: tf.Tensor):
        with tf.control_dependencies([skipped.count_in(numbers)]):
            return tf.identity(features), labels, numbers

    return count


def finish_batch(features: tf.Tensor, labels: tf.Tensor, spec: InputSpec,
                 batch: int | None) -> tuple[tf.Tensor, tf.Tensor]:
    """Cast and reshape parsed values to [B, *feature_shape] and [B, *label_shape]."""
    features = tf.reshape(tf.cast(features, spec.feature_dtype), (-1, *spec.feature_shape))
    labels = tf.reshape(tf.cast(labels, spec.label_dtype), (-1, *spec.label_shape))
    features.set_shape((batch, *spec.feature_shape))
    labels.set_shape((batch, *spec.label_shape))
    return features, labels


def checked_labels(labels: tf.Tensor, spec: InputSpec, where: str) -> tf.Tensor:
    """labels: any shape; fails at run time if a label is outside [0, num_classes)."""
    message = f"{where}: labels must be in [0, {spec.num_classes})"
    checks = [
        tf.debugging.assert_non_negative(labels, message=message),
        tf.debugging.assert_less(labels, tf.cast(spec.num_classes, labels.dtype), message=message),
    ]
    with tf.control_dependencies(checks):
        return tf.identity(labels)
