"""The stages every file and array pipeline shares: options, the evaluation files read
in order, the two ways a batch gets parsed, and in-memory arrays by position.

* ``batched``: records -> batch -> parse the whole batch in one parallel ``map``. Parsing
  stays vectorised (one ``parse_example`` or gather per batch); the fast path. Sources
  held in memory (builtin, npz, csv) evaluate batches of their examples' indices so
  (``array_dataset``) and train on batches gathered by position (``positioned_arrays``).
* ``per_record``: records -> numbered -> parse each in a parallel ``map`` -> batch ->
  finish the batch. For what must be parsed one at a time (images of varying sizes),
  and for ``data.on_bad_record: skip``: a record that fails is dropped on its own
  (``ignore_errors``), found from the gap in the numbers and named
  (``launch.data.skips.RecordGaps``), then skipped or failed.

Records come as (key, origin, record) triples: key, an int64, is the example's position
(launch.data.position), which seeds its randomness (a crop); origin, an int64, says
where the record is (``ORIGIN_FILE`` times its file's index plus its index in the
file), so a record that fails can be named. The order of the training records is
launch.data.order's and launch.data.record_order's, made before parsing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from launch.data.errors import DataError
from launch.data.order import EpochOrder
from launch.data.position import BatchPart
from launch.data.skips import END_OF_STREAM, RecordGaps, SkippedRecords
from models import InputSpec

AUTOTUNE = tf.data.AUTOTUNE

# origin = file index * ORIGIN_FILE + the record's index in its file.
ORIGIN_FILE = 1 << 40
# Records whose origins are noted with one Python call.
_NOTED_AT_ONCE = 256

# (keys, records) -> (features, labels, ...): a batch's or a record's parse function.
Parse = Callable[[tf.Tensor, tf.Tensor], tuple[tf.Tensor, ...]]
# (keys, features, labels) -> (features, labels, ...): the last stage of a batch.
Finish = Callable[[tf.Tensor, tf.Tensor, tf.Tensor], tuple[tf.Tensor, ...]]


@dataclass(frozen=True)
class Pipeline:
    """The options shared by every source.

    skipped: with ``on_bad_record: skip``, the counter of skipped records; None fails
    instead.
    """

    batch_size: int
    shuffle_buffer: int
    num_parallel_calls: int
    prefetch: int
    seed: int
    training: bool
    repeat: bool
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
    threads (None: the shared inter-op pool).

    tf.data's autotuning model is off: it runs on a thread that an iterator's end waits
    for, and that thread notices the end only when its period (which grows to a minute)
    is up, so a job's end, a SIGTERM's stop included, waited 4-19 s after 60 steps of
    the default job and 50 s after 600 (BENCHMARKS.md). Without it an ``auto``
    parallelism is the pool's size and an ``auto`` prefetch grows while the step waits
    for it; the pipelines alone ran as fast (JPEG decoding 10,700 examples/s against
    9,400 with it, arrays 60,000 against 83,000, each far above a step's need)."""
    options = tf.data.Options()
    options.autotune.enabled = False
    if threads is not None:
        options.threading.private_threadpool_size = threads
    return options


def interleave_files(files: list[str], reader: Callable[[tf.Tensor], tf.data.Dataset]
                     ) -> tf.data.Dataset:
    """The evaluation records of ``files``, one file after another, as (origin, origin,
    record) triples (launch.data.record_stream reads the training records)."""

    def read(name: tf.Tensor, index: tf.Tensor) -> tf.data.Dataset:
        first = index * ORIGIN_FILE
        return reader(name).enumerate().map(
            lambda number, record: (first + number, first + number, record))

    names = tf.data.Dataset.from_tensor_slices((files, tf.range(len(files), dtype=tf.int64)))
    return names.flat_map(read)


def batched(records: tf.data.Dataset, p: Pipeline, parse: Parse) -> tf.data.Dataset:
    """(key, origin, record) triples, one per example -> batch, parse, prefetch.

    ``parse(keys, records)`` maps the int64 keys [B] of a batch's examples (their
    positions: the seeds of their randomness) and their records [B] to features
    [B, *feature_shape], labels [B, *label_shape] and the keys.
    """
    if p.repeat:
        records = records.repeat()
    batches = records.batch(p.batch_size, drop_remainder=p.drop_remainder)
    batches = batches.map(lambda keys, origins, data: parse(keys, data),
                          num_parallel_calls=p.num_parallel_calls)
    return batches.prefetch(p.prefetch)


def per_record(records: tf.data.Dataset, p: Pipeline, parse_one: Parse, finish: Finish,
               gaps: RecordGaps) -> tf.data.Dataset:
    """(key, origin, record) triples -> parse each -> batch -> finish -> prefetch.

    parse_one(key, record): the example's int64 key (its position: the seed of its
    randomness) and record -> its features and labels. finish(keys [B], features
    [B, ...], labels [B, ...]) -> the final batch (features, labels, keys). A record
    whose parse_one raises is dropped and handed to ``gaps`` (by its origin), which
    skips or fails it.
    """
    if p.repeat:
        records = records.repeat()
    numbered = records.enumerate().batch(_NOTED_AT_ONCE).map(_noted(gaps)).unbatch()

    def parse(number: tf.Tensor, triple: tuple) -> tuple[tf.Tensor, ...]:
        key, _, record = triple
        return (*parse_one(key, record), key, number)

    # Dropped records are found as gaps in the numbers, so their order must hold.
    examples = numbered.map(parse, num_parallel_calls=p.num_parallel_calls,
                            deterministic=True).ignore_errors()
    batches = examples.batch(p.batch_size, drop_remainder=p.drop_remainder)
    if not p.drop_remainder:
        # Records dropped after the last good one leave no gap: the marker shows them.
        # (Full batches drop a last partial one anyway, and with it such records.)
        batches = batches.concatenate(_end_marker(batches.element_spec))
    batches = batches.map(_observed(gaps)).filter(
        lambda features, labels, keys, numbers: tf.not_equal(numbers[0], END_OF_STREAM))
    batches = batches.map(lambda features, labels, keys, numbers: finish(keys, features, labels),
                          num_parallel_calls=p.num_parallel_calls)
    return batches.prefetch(p.prefetch)


def _noted(gaps: RecordGaps) -> Callable:
    def note(numbers: tf.Tensor, triples: tuple) -> tuple:
        with tf.control_dependencies([gaps.note_op(numbers, triples[1])]):
            return tf.identity(numbers), triples

    return note


def _observed(gaps: RecordGaps) -> Callable:
    """A sequential map, so the gaps are found in order."""
    def observe(features: tf.Tensor, labels: tf.Tensor, keys: tf.Tensor, numbers: tf.Tensor):
        with tf.control_dependencies([gaps.observe_op(numbers)]):
            return tf.identity(features), labels, keys, numbers

    return observe


def _end_marker(spec: tuple[tf.TensorSpec, ...]) -> tf.data.Dataset:
    """One batch of one zero example numbered END_OF_STREAM, shaped as ``spec``'s."""
    features, labels, keys, _ = (tf.zeros([1, *[d or 1 for d in s.shape[1:]]], s.dtype)
                                 for s in spec)
    return tf.data.Dataset.from_tensors(
        (features, labels, keys, tf.constant([END_OF_STREAM], tf.int64)))


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
    """In-memory arrays features [N, *feature_shape], labels [N, *label_shape] -> evaluation
    batches, in order (training: positioned_arrays).

    The arrays stay in Python and a ``numpy_function`` gathers each batch: ``from_tensor_slices``
    would embed them in the GraphDef as constants (2 GB limit, and copies in every meta
    graph and TensorBoard graph).
    """
    gather = _gatherer(features, labels, spec)

    def parse(index: tf.Tensor, _: tf.Tensor) -> tuple[tf.Tensor, ...]:
        x, y = tf.numpy_function(gather, [index], [spec.feature_dtype, spec.label_dtype],
                                 stateful=False, name="gather_examples")
        return (*finish_batch(x, y, spec, index.shape[0]), index)

    indices = tf.data.Dataset.range(len(features))
    return batched(indices.map(lambda i: (i, i, i)), p, parse)


def positioned_arrays(features: np.ndarray, labels: np.ndarray, spec: InputSpec,
                      order: EpochOrder, part: BatchPart, start: tf.Tensor, batches: tf.Tensor,
                      p: Pipeline) -> tf.data.Dataset:
    """In-memory arrays -> training batches by position: batch k is ``part`` of the global
    batch at positions start + k * B onwards, its examples those ``order`` puts there.
    Yields features [b, ...], labels [b, ...], positions int64 [b]."""
    gather = _gatherer(features, labels, spec)

    def examples_at(positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return gather(order.examples(positions))

    def batch(k: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        first = start + k * part.global_batch + part.offset
        positions = first + tf.range(part.size, dtype=tf.int64)
        x, y = tf.numpy_function(examples_at, [positions], [spec.feature_dtype,
                                                            spec.label_dtype],
                                 stateful=False, name="gather_examples")
        return (*finish_batch(x, y, spec, part.size), positions)

    batches = tf.data.Dataset.range(batches).map(batch, num_parallel_calls=p.num_parallel_calls)
    return batches.prefetch(p.prefetch)


def _gatherer(features: np.ndarray, labels: np.ndarray, spec: InputSpec
              ) -> Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """index int64 [n] -> (features[index], labels[index]), in the spec's dtypes."""
    features = np.ascontiguousarray(features, dtype=spec.feature_dtype.as_numpy_dtype)
    labels = np.ascontiguousarray(labels, dtype=spec.label_dtype.as_numpy_dtype)
    return lambda index: (features[index], labels[index])
