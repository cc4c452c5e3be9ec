"""Input pipelines by source name: ``(features, labels)`` batches of the GLOBAL batch size.

The tower builder splits every batch across its devices, so a pipeline here only has
to produce whole global batches:

    dataset = make_dataset("builtin", model.input_spec, batch_size=128)
    features, labels = input_tensors(dataset)  # [128, *feature_shape], [128, *label_shape]

Each function names a source (``synthetic``, ``builtin``, ``npz``, ``csv``,
``tfrecord``: ``launch.data.sources``, a module each) and its options as keywords; a
job's runtime holds the source itself (``source_of(job.data)``).

Training batches are taken by position (:mod:`launch.data.position`) in the order of
:mod:`launch.data.order` (in-memory sources: a permutation of every epoch) or
:mod:`launch.data.record_order` (TFRecord files: files permuted, read round robin,
windows shuffled), then parsed; evaluation batches read the data in order. Batches
are full (``drop_remainder=True``, static batch dimension) whenever the stream is
infinite or ``training`` is set; a finite evaluation stream keeps its last, partial
batch so that every example is seen once (batch dimension ``None``).

Datasets are built in the default graph under ``/cpu:0``: build them in the graph the
trainer runs, then take tensors with :func:`input_tensors`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from launch.config import DataConfig, ImageConfig, RecordSchemaConfig
from launch.data.formats import PathArg
from launch.data.skips import INPUT_OP_NAME, SkippedRecords
from launch.data.sources import source_of
from models import InputSpec


def _named(source: str, path: PathArg = None, **options) -> DataConfig:
    """A data section for ``source`` with these options (unchecked: the source checks
    what it reads)."""
    return DataConfig(source=source, path=path, **options)


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
    (builtin, npz, csv) shuffle whole epochs; TFRecord sources permute their files and
    windows of ``shuffle_buffer`` records. ``label_column`` / ``feature_columns``: a CSV source's
    columns (``data.label_column``, ``data.feature_columns``; None: every column but the
    label). ``schema`` / ``image``: a TFRecord source's layout and image options
    (``data.schema``, ``data.image``). ``skipped``: leave out records that fail to parse
    or decode (csv, tfrecord), naming and counting them there; None fails instead: a
    DataError naming the file and the record, or, for what only decoding finds, a
    TensorFlow error mid-run that :func:`launch.data.input_errors` turns into one.
    ``threads``: run the pipeline on its own pool of that many threads (None:
    TensorFlow's inter-op pool). ``shard=(i, n)``: training, this reader's part, so n
    readers (workers, Horovod ranks) see disjoint data: examples [i B, (i + 1) B) of
    every n B of the one order. Cheap checks run here (a CSV or an npz is
    read whole, a TFRecord's first record); :func:`check_source` is the thorough
    pre-flight. Raises DataError.
    """
    cfg = _named(source, path, label_column=label_column, feature_columns=feature_columns,
                 shuffle_buffer=shuffle_buffer, num_parallel_calls=num_parallel_calls,
                 prefetch=prefetch, threads=threads, num_examples=num_examples, seed=seed,
                 schema=schema, image=image or ImageConfig(),
                 on_bad_record="skip" if skipped is not None else "fail")
    return source_of(cfg).dataset(spec, batch_size, training=training, repeat=repeat,
                                  shard=shard, skipped=skipped)


def check_source(source: str, spec: InputSpec, path: PathArg = None,
                 label_column: str = "label", schema: RecordSchemaConfig | None = None, *,
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
    """
    cfg = _named(source, path, label_column=label_column, schema=schema,
                 feature_columns=feature_columns, on_bad_record=on_bad_record)
    source_of(cfg).check(spec)


def load_arrays(source: str, spec: InputSpec, path: PathArg, label_column: str = "label",
                feature_columns: Sequence[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """All examples of an npz or CSV source as checked numpy arrays in the spec's dtypes:
    features [N, *feature_shape], labels [N, *label_shape]. A bad row is a DataError."""
    cfg = _named(source, path, label_column=label_column, feature_columns=feature_columns)
    return source_of(cfg).arrays(spec)


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
