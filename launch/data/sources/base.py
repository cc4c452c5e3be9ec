"""What every data source is: a job's data section read as one format (``data.source``).

A ``Source`` holds the data section and answers, for its format: what the data says of
each example before the model is known (``data_spec``), whether the data can feed the
model's input spec (``check``, before anything is written), and the batches one reader
takes (``training_dataset`` for this process, ``eval_dataset``). A subclass says how
its format does each; ``launch.data.sources`` lists them by name.

Readers: a job of several processes has each read its own share (``shard``: index,
count), so n readers see disjoint data; a source that reads files gives each reader
whole files when there are enough of them (``shards_files``), else every n-th example.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import tensorflow as tf

from launch.config import DataConfig
from launch.data.errors import DataError
from launch.data.formats import PathArg, describe, resolve_files
from launch.data.skips import SkippedRecords, ordinal
from launch.data.stream import Pipeline, autotune, files_of_shard, pipeline_options
from models import InputSpec

# An evaluation of generated data (which has no end) takes eval.steps batches, this
# many when eval.steps is null.
GENERATED_EVAL_BATCHES = 20

Shard = tuple[int, int]  # (index, count): this reader's part of the data


@dataclass(frozen=True)
class DataSpec:
    """Per example, what a source gives; None where the data does not say.

    where: what told us, for messages (``data.schema``, a file). classes_from: where
    num_classes came from, for messages ('the largest label, 2, at d.csv line 7').
    exact: images are resized to exactly feature_shape; otherwise features are
    reshaped to the model's shape, so only their number must agree.
    """

    where: str
    feature_shape: tuple[int, ...] | None = None
    feature_dtype: tf.DType | None = None
    label_shape: tuple[int, ...] | None = None
    num_classes: int | None = None
    classes_from: str = ""
    exact: bool = False

    def input_spec(self) -> InputSpec | None:
        """The whole input spec, when the data gives every part of it."""
        if None in (self.feature_shape, self.feature_dtype, self.label_shape, self.num_classes):
            return None
        return InputSpec(self.feature_shape, self.feature_dtype, self.label_shape, tf.int32,
                         self.num_classes)

    def missing(self) -> list[str]:
        named = {"features shape": self.feature_shape, "features dtype": self.feature_dtype,
                 "label shape": self.label_shape, "num_classes": self.num_classes}
        return [name for name, value in named.items() if value is None]


class Source:
    """One data format, reading the job's data section ``cfg``.

    name: its ``data.source``. generated: made in this process from data.seed
    (synthetic, builtin), not read from files: an evaluation takes a fixed number of
    its batches. shards_files: a reader's share is whole files when there are at least
    as many files as readers.
    """

    name: ClassVar[str]
    generated: ClassVar[bool] = False
    shards_files: ClassVar[bool] = False

    def __init__(self, cfg: DataConfig) -> None:
        self.cfg = cfg

    # ------------------------------------------------------------- what it reads

    def paths(self, training: bool = True) -> PathArg:
        """The files read: data.path, for evaluation data.eval_path when it is set."""
        return self.cfg.path if training or not self.cfg.eval_path else self.cfg.eval_path

    def files(self, training: bool = True) -> list[str]:
        """The paths as files (globs resolved); DataError for a missing file or glob."""
        return resolve_files(self.paths(training), self.name)

    def where(self, training: bool = True) -> str:
        """The data read, for messages: its paths as given, or the generated source."""
        paths = self.paths(training)
        if paths is None:
            return f"data.source {self.name}"
        return describe(paths, [paths] if isinstance(paths, str) else list(paths))

    def data_spec(self) -> DataSpec:
        """What the data gives per example, known without the model (nothing, for data
        made to the model's spec)."""
        return DataSpec(self.where())

    def reader_line(self, shard: Shard) -> str | None:
        """What reader ``shard`` reads of a job's files, when it reads a share of them:
        its files, or every n-th record when there are fewer files than readers."""
        index, count = shard
        if count == 1 or not self.shards_files:
            return None
        files = self.files()
        mine = files_of_shard(files, shard)
        if mine is None:
            return (f"input: every {ordinal(count)} record of the {len(files)} file(s) of "
                    f"{self.where()} (reader {index + 1} of {count}; fewer files than readers)")
        shown = mine if len(mine) <= 4 else [*mine[:3], "...", mine[-1]]
        return (f"input: {len(mine)} of {len(files)} files (reader {index + 1} of {count}): "
                f"{', '.join(shown)}")

    # ------------------------------------------------------------- its checks

    def check(self, spec: InputSpec, *, training: bool = True, shard: Shard = (0, 1)) -> None:
        """Whether the data (reader ``shard``'s share of it) can feed ``spec``, without
        building a graph; DataError, one line, naming the file and record where one is
        bad. The generated sources make data to the spec: nothing to read."""

    def skips(self) -> bool:
        """data.on_bad_record: skip leaves bad records out instead of failing."""
        return self.cfg.on_bad_record == "skip"

    # ------------------------------------------------------------- its batches

    def training_dataset(self, spec: InputSpec, batch_size: int, shard: Shard,
                         skipped: SkippedRecords | None = None) -> tf.data.Dataset:
        """This reader's training batches, features [B, ...] and labels [B, ...]: its
        share, shuffled, repeated until train.steps, or data.epochs times through."""
        epochs = self.cfg.epochs
        dataset = self.dataset(spec, batch_size, training=True, repeat=not epochs,
                               shard=shard, skipped=skipped)
        if epochs and epochs > 1:
            dataset = dataset.repeat(epochs)  # each pass shuffled afresh, as repeat() is
        return dataset

    def eval_dataset(self, spec: InputSpec, batch_size: int,
                     skipped: SkippedRecords | None = None) -> tf.data.Dataset:
        """The evaluation data, read once in order: every example counts once, the last
        batch holding what is left (batch dimension None)."""
        return self.dataset(spec, batch_size, training=False, repeat=False, skipped=skipped)

    def eval_batches(self, steps: int | None, batch_size: int) -> tuple[int | None, str | None]:
        """How many batches an evaluation reads (None: to the data's end, at most
        eval.steps), and, for data without an end, what it scores instead."""
        return steps, None

    def dataset(self, spec: InputSpec, batch_size: int, *, training: bool, repeat: bool,
                shard: Shard = (0, 1), skipped: SkippedRecords | None = None
                ) -> tf.data.Dataset:
        """Batches of features [B, *feature_shape] and labels [B, *label_shape], built
        on /cpu:0 of the default graph. training: the training data, shuffled (and
        augmented); else the evaluation data in order. Batches are full whenever the
        stream repeats or ``training`` is set. skipped: where records left out under
        data.on_bad_record: skip are counted (None: nowhere); with ``fail`` they raise
        DataError."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise DataError(f"batch_size must be a positive int, got {batch_size!r}")
        cfg = self.cfg
        if not self.skips():
            skipped = None
        elif skipped is None:
            skipped = SkippedRecords(self.where(training), lambda line: None)
        p = Pipeline(batch_size, int(cfg.shuffle_buffer),
                     autotune(cfg.num_parallel_calls, "num_parallel_calls"),
                     autotune(cfg.prefetch, "prefetch"), int(cfg.seed), bool(training),
                     bool(repeat), shard, skipped)
        with tf.device("/cpu:0"), tf.name_scope("input"):
            threads = None if cfg.threads == "auto" else cfg.threads
            return self.batches(spec, p).with_options(pipeline_options(threads))

    def batches(self, spec: InputSpec, p: Pipeline) -> tf.data.Dataset:
        """The format's pipeline for the options ``p``."""
        raise NotImplementedError

    def arrays(self, spec: InputSpec, training: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Every example as checked numpy arrays in the spec's dtypes: features
        [N, *feature_shape], labels [N, *label_shape] (sources held in memory)."""
        raise DataError(f"cannot load arrays from a {self.name!r} source; use 'npz' or 'csv'")


def as_spec(features: np.ndarray, labels: np.ndarray,
            spec: InputSpec) -> tuple[np.ndarray, np.ndarray]:
    """features [N, ...] and labels [N, ...] reshaped to the spec's example shapes and cast
    to its dtypes."""
    features = features.reshape(-1, *spec.feature_shape)
    labels = labels.reshape(-1, *spec.label_shape)
    return (features.astype(spec.feature_dtype.as_numpy_dtype, copy=False),
            labels.astype(spec.label_dtype.as_numpy_dtype, copy=False))


def generated_batches(steps: int | None) -> tuple[int, str]:
    """How many batches an evaluation of generated data (which has no end) takes:
    eval.steps, GENERATED_EVAL_BATCHES when it is null; and why, for its note."""
    batches = steps or GENERATED_EVAL_BATCHES
    return batches, "eval.steps" if steps else (
        f"eval.steps is null: {batches} for a generated source")
