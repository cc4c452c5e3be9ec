"""The stages every file and array pipeline shares: options, sharding, file interleave,
shuffle/repeat/batch, and the two ways a batch gets parsed.

* ``batched``: records -> batch -> parse the whole batch in one parallel ``map``. Parsing
  stays vectorised (one ``parse_example`` or gather per batch); the fast path. Sources
  held in memory (builtin, npz, csv) batch their examples' indices so
  (``array_dataset``).
* ``per_record``: records -> numbered -> parse each in a parallel ``map`` -> batch ->
  finish the batch. For what must be parsed one at a time (images of varying sizes),
  and for ``data.on_bad_record: skip``: a record that fails is dropped on its own
  (``ignore_errors``), found from the gap in the numbers and named
  (``launch.data.skips.RecordGaps``), then skipped or failed.

Records come as (origin, record) pairs: origin, an int64, says where the record is
(``ORIGIN_FILE`` times its file's index plus its index in the file), so a record that
fails can be named.

Both shuffle records before parsing, so the shuffle buffer holds small serialized
records (or indices), never decoded images.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from launch.data.errors import DataError
from launch.data.skips import END_OF_STREAM, RecordGaps, SkippedRecords
from models import InputSpec

AUTOTUNE = tf.data.AUTOTUNE

# Files read at once by one pipeline: enough to mix shards and hide a slow read.
MAX_INTERLEAVE_FILES = 16
# origin = file index * ORIGIN_FILE + the record's index in its file.
ORIGIN_FILE = 1 << 40
# Records whose origins are noted with one Python call.
_NOTED_AT_ONCE = 256

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
    """Read ``files`` in parallel (shuffled file order when training) into (origin,
    record) pairs; reader(name) gives a file's records. Evaluation reads the files one
    after another, so its examples come in file order."""

    def read(name: tf.Tensor, index: tf.Tensor) -> tf.data.Dataset:
        first = index * ORIGIN_FILE
        return reader(name).enumerate().map(lambda number, record: (first + number, record))

    names = tf.data.Dataset.from_tensor_slices((files, tf.range(len(files), dtype=tf.int64)))
    if p.training:
        names = names.shuffle(len(files), seed=p.seed, reshuffle_each_iteration=True)
    cycle = min(len(files), MAX_INTERLEAVE_FILES) if p.training else 1
    calls = p.num_parallel_calls if p.num_parallel_calls == AUTOTUNE else min(
        p.num_parallel_calls, cycle)
    return names.interleave(read, cycle_length=cycle, num_parallel_calls=calls)


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
               parse_one: Parse, finish: Finish, gaps: RecordGaps) -> tf.data.Dataset:
    """(origin, record) pairs -> shuffle, repeat -> parse each -> batch -> finish -> prefetch.

    parse_one(number, record): number is the record's int64 position in the stream
    (a seed for per-example randomness); gives one example's features and labels.
    finish(number, features [B, ...], labels [B, ...]): number is the batch's; gives
    the final batch. A record whose parse_one raises is dropped and handed to ``gaps``
    (by its origin), which skips or fails it.
    """
    numbered = _shuffled(records, p, shuffle_buffer).enumerate()
    numbered = numbered.batch(_NOTED_AT_ONCE).map(_noted(gaps)).unbatch()

    def parse(number: tf.Tensor, pair: tuple) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        return (*parse_one(number, pair[1]), number)

    # Dropped records are found as gaps in the numbers, so their order must hold.
    examples = numbered.map(parse, num_parallel_calls=p.num_parallel_calls,
                            deterministic=True).ignore_errors()
    batches = examples.batch(p.batch_size, drop_remainder=p.drop_remainder)
    if not p.drop_remainder:
        # Records dropped after the last good one leave no gap: the marker shows them.
        # (Full batches drop a last partial one anyway, and with it such records.)
        batches = batches.concatenate(_end_marker(batches.element_spec))
    batches = batches.map(_observed(gaps)).filter(
        lambda features, labels, numbers: tf.not_equal(numbers[0], END_OF_STREAM))

    def finish_numbered(number: tf.Tensor, batch: tuple) -> tuple[tf.Tensor, tf.Tensor]:
        features, labels, _ = batch
        return finish(number, features, labels)

    batches = batches.enumerate().map(finish_numbered, num_parallel_calls=p.num_parallel_calls)
    return batches.prefetch(p.prefetch)


def _noted(gaps: RecordGaps) -> Callable:
    def note(numbers: tf.Tensor, pairs: tuple) -> tuple:
        with tf.control_dependencies([gaps.note_op(numbers, pairs[0])]):
            return tf.identity(numbers), pairs

    return note


def _observed(gaps: RecordGaps) -> Callable:
    """A sequential map, so the gaps are found in order."""
    def observe(features: tf.Tensor, labels: tf.Tensor, numbers: tf.Tensor):
        with tf.control_dependencies([gaps.observe_op(numbers)]):
            return tf.identity(features), labels, numbers

    return observe


def _end_marker(spec: tuple[tf.TensorSpec, ...]) -> tf.data.Dataset:
    """One batch of one zero example numbered END_OF_STREAM, shaped as ``spec``'s."""
    features, labels, _ = (tf.zeros([1, *[d or 1 for d in s.shape[1:]]], s.dtype) for s in spec)
    return tf.data.Dataset.from_tensors(
        (features, labels, tf.constant([END_OF_STREAM], tf.int64)))


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


def array_dataset(features: np.ndarray, labels: np.ndarray, spec: InputSpec,
                  p: Pipeline) -> tf.data.Dataset:
    """In-memory arrays features [N, *feature_shape], labels [N, *label_shape] -> batches.

    The arrays stay in Python and a ``numpy_function`` gathers each batch of shuffled
    indices: ``from_tensor_slices`` would embed them in the GraphDef as constants (2 GB
    limit, and copies in every meta graph and TensorBoard graph). Indices cost 8 bytes
    an example, so training shuffles the whole epoch whatever ``shuffle_buffer`` is,
    unless it is 0 (no shuffling: records in order, as every source gives them then).
    """
    features = np.ascontiguousarray(features, dtype=spec.feature_dtype.as_numpy_dtype)
    labels = np.ascontiguousarray(labels, dtype=spec.label_dtype.as_numpy_dtype)

    def gather(index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return features[index], labels[index]

    def parse(_: tf.Tensor, index: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        x, y = tf.numpy_function(gather, [index], [spec.feature_dtype, spec.label_dtype],
                                 stateful=False, name="gather_examples")
        return finish_batch(x, y, spec, index.shape[0])

    buffer = len(features) if p.shuffle_buffer else 0
    return batched(tf.data.Dataset.range(len(features)), p, buffer, parse)
