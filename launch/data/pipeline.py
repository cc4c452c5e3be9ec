"""Input pipelines: ``(features, labels)`` batches of the GLOBAL batch size.

The tower builder splits every batch across its devices, so a pipeline here only has
to produce whole global batches:

    dataset = make_dataset("builtin", model.input_spec, batch_size=128)
    features, labels = input_tensors(dataset)  # [128, *feature_shape], [128, *label_shape]

Sources (``source=``):

* ``synthetic``: one random batch (uniform floats in [0, 1), ints in [0, num_classes)),
  generated once in the graph and repeated, so input costs nothing (benchmarks).
* ``builtin``: the learnable data set of :mod:`launch.data.builtin`, generated from
  ``seed``; ``training=False`` gives the held-out split.
* ``npz``: one ``.npz`` file with arrays ``features``/``labels`` (or ``x``/``y``).
* ``csv``: files with a header row, a label column named ``label_column`` of class ids
  and ``prod(feature_shape)`` numeric feature columns (``feature_columns``, or every
  other column), read and checked whole before training and held in memory
  (:mod:`launch.data.csv_table`).
* ``tfrecord``: sharded files of ``tf.train.Example``, read in parallel, laid out as
  ``schema`` says (:mod:`launch.data.record_schema`): numeric lists, raw pixels or encoded
  JPEG/PNG images (decoded, augmented and normalised as ``image`` says,
  :mod:`launch.data.images`); without a schema, a ``features`` float (int64 for integer
  specs) list and a ``label`` or ``labels`` int64 list.

Every in-memory pipeline (builtin, npz, csv) is: example indices -> shard -> shuffle
(training, seeded, the whole epoch) -> repeat -> batch -> gather -> prefetch. Every
TFRecord pipeline is: records -> shard -> shuffle (training, seeded) -> repeat ->
batch -> parse -> prefetch (:mod:`launch.data.stream`). Batches are full
(``drop_remainder=True``, static batch dimension) whenever the stream is infinite or
``training`` is set; a finite evaluation stream keeps its last, partial batch so that
every example is seen once (batch dimension ``None``).

Datasets are built in the default graph under ``/cpu:0``: build them in the graph the
trainer runs, then take tensors with :func:`input_tensors`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from launch.config import DATA_SOURCES as SOURCES  # config, the lower layer, owns the list
from launch.config import ImageConfig, RecordSchemaConfig
from launch.data.builtin import builtin_arrays, builtin_kind
from launch.data.csv_table import csv_examples
from launch.data.errors import DataError
from launch.data.formats import (
    PathArg,
    check_npz,
    describe,
    load_npz,
    resolve_files,
    single_file,
)
from launch.data.record_schema import RecordSchema, legacy_schema, record_schema
from launch.data.skips import INPUT_OP_NAME, SkippedRecords
from launch.data.stream import (
    Pipeline,
    autotune,
    batched,
    files_of_shard,
    finish_batch,
    pipeline_options,
    shard_files,
)
from launch.data.tfrecord import (
    check_first_record,
    check_tfrecord_files,
    first_label_key,
    tfrecord_dataset,
)
from models import InputSpec


def _array_dataset(features: np.ndarray, labels: np.ndarray, spec: InputSpec,
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


def _synthetic_dataset(spec: InputSpec, p: Pipeline, num_examples: int) -> tf.data.Dataset:
    """One random batch, made once by stateless random ops, cached and repeated.

    Yields features [B, *feature_shape] (uniform [0, 1) floats or ints in
    [0, num_classes)) and labels [B, *label_shape] in [0, num_classes).
    """
    seed = p.seed * 2 + (0 if p.training else 1)

    def uniform(shape: tuple[int, ...], dtype: tf.DType, salt: int) -> tf.Tensor:
        seeds = tf.constant([seed, salt], tf.int64)
        if dtype.is_integer:
            return tf.random.stateless_uniform(shape, seeds, minval=0, maxval=spec.num_classes,
                                               dtype=tf.int32 if dtype == tf.int32 else tf.int64)
        return tf.random.stateless_uniform(shape, seeds, dtype=tf.float32)

    def make(_: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        x = uniform((p.batch_size, *spec.feature_shape), spec.feature_dtype, 1)
        y = uniform((p.batch_size, *spec.label_shape), spec.label_dtype, 2)
        return finish_batch(x, y, spec, p.batch_size)

    dataset = tf.data.Dataset.range(1).map(make).cache().repeat()
    if not p.repeat:
        dataset = dataset.take(max(1, num_examples // p.batch_size))
    return dataset.prefetch(p.prefetch)


def _csv_dataset(spec: InputSpec, path: PathArg, label_column: str,
                 feature_columns: Sequence[str] | None, p: Pipeline) -> tf.data.Dataset:
    """CSV rows, read and checked whole (:mod:`launch.data.csv_table`), as batches of
    in-memory arrays. A reader's share is its files when there are enough of them
    (files_of_shard), else every n-th row. Rows left out under ``skip`` are logged and
    counted here, once: they are not part of the data set."""
    files = resolve_files(path, "csv")
    mine, p = shard_files(files, p)
    examples = csv_examples(files, spec, label_column, feature_columns,
                            skip=p.skipped is not None, mine=mine)
    if examples.bad_count:
        p.skipped.skipped([str(row) for row in examples.bad], examples.bad_count)
    return _array_dataset(examples.features.reshape(-1, *spec.feature_shape), examples.labels,
                          spec, p)


def _record_schema(files: list[str], spec: InputSpec, schema: RecordSchemaConfig | None,
                   where: str) -> RecordSchema:
    if schema is None:
        return legacy_schema(spec, first_label_key(files, where))
    return record_schema(schema, spec)


# ----------------------------------------------------------------------- public API


def make_dataset(source: str, spec: InputSpec, batch_size: int, *, path: PathArg = None,
                 label_column: str = "label", feature_columns: Sequence[str] | None = None,
                 shuffle_buffer: int = 10000,
                 num_parallel_calls: int | None = None, prefetch: int | None = None,
                 num_examples: int = 20000, seed: int = 0, training: bool = True,
                 repeat: bool = True, shard: tuple[int, int] = (0, 1),
                 schema: RecordSchemaConfig | None = None, image: ImageConfig | None = None,
                 skipped: SkippedRecords | None = None,
                 threads: int | None = None) -> tf.data.Dataset:
    """A dataset of (features [B, *feature_shape], labels [B, *label_shape]), B = batch_size.

    ``training=False`` reads the evaluation data (builtin: the held-out split; files:
    ``path`` as given) without shuffling or augmenting. ``num_parallel_calls``/
    ``prefetch``: None (or 'auto') means ``tf.data.AUTOTUNE``. ``num_examples`` sizes
    the builtin split (and a non-repeating synthetic stream). In-memory sources
    (builtin, npz, csv) shuffle whole epochs of indices; TFRecord sources use
    ``shuffle_buffer`` records. ``label_column`` / ``feature_columns``: a CSV source's
    columns (``data.label_column``, ``data.feature_columns``; None: every column but the
    label). ``schema`` / ``image``: a TFRecord source's layout and image options
    (``data.schema``, ``data.image``). ``skipped``: leave out records that fail to parse
    or decode (csv, tfrecord), naming and counting them there; None fails instead: a
    DataError naming the file and the record, or, for what only decoding finds, a
    TensorFlow error mid-run that :func:`launch.data.input_errors` turns into one.
    ``threads``: run the pipeline on its own pool of that many threads (None:
    TensorFlow's inter-op pool). ``shard=(i, n)``: this reader's part, so n readers
    (workers, Horovod ranks) see disjoint data: files i, i + n, ... when there are at
    least n files, else every n-th example. The ops are
    built in the default graph on /cpu:0. Cheap checks run here (a CSV or an npz is
    read whole, a TFRecord's first record); :func:`check_source` is the thorough
    pre-flight. Raises DataError.
    """
    if source not in SOURCES:
        raise DataError(f"unknown data source {source!r}; accepted: {', '.join(SOURCES)}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise DataError(f"batch_size must be a positive int, got {batch_size!r}")
    p = Pipeline(batch_size, int(shuffle_buffer), autotune(num_parallel_calls,
                 "num_parallel_calls"), autotune(prefetch, "prefetch"), int(seed),
                 bool(training), bool(repeat), shard, skipped)
    with tf.device("/cpu:0"), tf.name_scope("input"):
        if source == "synthetic":
            dataset = _synthetic_dataset(spec, p, num_examples)
        elif source in ("builtin", "npz"):
            arrays = (builtin_arrays(spec, num_examples, seed, training) if source == "builtin"
                      else load_arrays("npz", spec, path))
            dataset = _array_dataset(*arrays, spec, p)
        elif source == "csv":
            dataset = _csv_dataset(spec, path, label_column, feature_columns, p)
        else:
            dataset = _tfrecord_dataset(spec, path, schema, image, p)
        return dataset.with_options(pipeline_options(threads))


def _tfrecord_dataset(spec: InputSpec, path: PathArg, schema: RecordSchemaConfig | None,
                      image: ImageConfig | None, p: Pipeline) -> tf.data.Dataset:
    files = resolve_files(path, "tfrecord")
    where = describe(path, files)
    record = _record_schema(files, spec, schema, where)
    check_first_record(files, record, where)
    return tfrecord_dataset(files, record, spec, image or ImageConfig(), where, p)


def check_source(source: str, spec: InputSpec, path: PathArg = None,
                 label_column: str = "label", schema: RecordSchemaConfig | None = None,
                 shard: tuple[int, int] = (0, 1), *,
                 feature_columns: Sequence[str] | None = None,
                 on_bad_record: str = "fail") -> None:
    """Pre-flight check of a source against ``spec`` without building or running a graph.

    Raises DataError, one line, for: an unknown source or unsupported builtin spec; a
    missing or unreadable file (a glob matching nothing names the glob); no examples;
    an npz without ``features``/``labels`` (or ``x``/``y``), with the wrong per-example
    size or dtype kind, or with labels outside [0, num_classes); a CSV whose header
    lacks the label or a feature column, whose feature columns are not
    prod(feature_shape), or with a bad row anywhere (naming its file, line, column and
    cause); a TFRecord file with a corrupt record (CRC of every record) or a record
    anywhere that does not match the schema (missing keys, kinds, sizes, labels out of
    range; images are decoded in the first CHECK_RECORDS records of each file), naming
    the file and the record, counted from 0. With ``on_bad_record='skip'`` bad rows
    and records are left for the pipeline to leave out; a source with none left is
    still an error. npz feature arrays are checked from their headers, not loaded.
    ``shard``: as make_dataset's; only this reader's files are checked.
    """
    if source not in SOURCES:
        raise DataError(f"unknown data source {source!r}; accepted: {', '.join(SOURCES)}")
    skip = on_bad_record == "skip"
    if source == "builtin":
        builtin_kind(spec)
    elif source == "npz":
        check_npz(single_file(path, "npz"), spec)
    elif source == "csv":
        files = resolve_files(path, "csv")
        csv_examples(files, spec, label_column, feature_columns, skip=skip,
                     mine=files_of_shard(files, shard))
    elif source == "tfrecord":
        files = resolve_files(path, "tfrecord")
        mine = files_of_shard(files, shard) or files
        check_tfrecord_files(mine, _record_schema(files, spec, schema, describe(path, files)),
                             describe(path, mine), skip=skip)


def input_tensors(dataset: tf.data.Dataset) -> tuple[tf.Tensor, tf.Tensor]:
    """Graph mode: features [B, *feature_shape] and labels [B, *label_shape] from a
    one-shot iterator on /cpu:0 (B is static unless a finite eval stream ends in a
    partial batch). Each ``session.run`` of them advances the iterator by one batch."""
    with tf.device("/cpu:0"):
        iterator = tf.compat.v1.data.make_one_shot_iterator(dataset)
        features, labels = iterator.get_next(name=INPUT_OP_NAME)
    features.set_shape(dataset.element_spec[0].shape)
    labels.set_shape(dataset.element_spec[1].shape)
    return features, labels


def load_arrays(source: str, spec: InputSpec, path: PathArg, label_column: str = "label",
                feature_columns: Sequence[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """All examples of an npz or CSV source as checked numpy arrays in the spec's dtypes:
    features [N, *feature_shape], labels [N, *label_shape]. A bad row is a DataError."""
    if source == "npz":
        features, labels = load_npz(single_file(path, "npz"), spec)
    elif source == "csv":
        examples = csv_examples(resolve_files(path, "csv"), spec, label_column, feature_columns,
                                skip=False)
        features, labels = examples.features, examples.labels
    else:
        raise DataError(f"cannot load arrays from a {source!r} source; use 'npz' or 'csv'")
    features = features.reshape(-1, *spec.feature_shape)
    labels = labels.reshape(-1, *spec.label_shape)
    return (features.astype(spec.feature_dtype.as_numpy_dtype, copy=False),
            labels.astype(spec.label_dtype.as_numpy_dtype, copy=False))
