"""What every data source is: a job's data section read as one format (``data.source``).

A ``Source`` holds the data section and answers, for its format: what the data says of
each example before the model is known (``data_spec``), whether the data can feed the
model's input spec (``check``, before anything is written), and the batches one reader
takes (``training_dataset`` for this process, ``eval_dataset``). A subclass says how
its format does each; ``launch.data.sources`` lists them by name.

Readers: in a job of several processes each takes its part of every global batch
(launch.data.position.BatchPart) of the one order every reader computes alike
(launch.data.order): so each reads the whole data set, and n readers train disjoint
examples at every step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import tensorflow as tf
from tensorflow.python.autograph.core import ag_ctx

from launch.config import DataConfig
from launch.data.errors import DataError
from launch.data.formats import PathArg, describe, file_size, resolve_files
from launch.data.order import EpochOrder
from launch.data.position import BatchPart
from launch.data.skips import SkippedRecords
from launch.data.stream import (
    Pipeline,
    array_dataset,
    autotune,
    pipeline_options,
    positioned_arrays,
)
from models import InputSpec

# batches: a training stream without end (it ends at train.steps).
NO_END = 2**62
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
    its batches.
    """

    name: ClassVar[str]
    generated: ClassVar[bool] = False

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

    # ------------------------------------------------------------- its checks

    def check(self, spec: InputSpec, *, training: bool = True) -> None:
        """Whether the data can feed ``spec``, without
        building a graph; DataError, one line, naming the file and record where one is
        bad. The generated sources make data to the spec: nothing to read."""

    def skips(self) -> bool:
        """data.on_bad_record: skip leaves bad records out instead of failing."""
        return self.cfg.on_bad_record == "skip"

    # ------------------------------------------------------------- its batches

    def training_dataset(self, spec: InputSpec, part: BatchPart, start: tf.Tensor,
                         batches: tf.Tensor, skipped: SkippedRecords | None = None
                         ) -> tf.data.Dataset:
        """This reader's training batches: its ``part`` of each global batch, the k-th
        global batch starting at position ``start`` + k * B, for k < ``batches`` (int64
        scalars; placeholders fed as the iterator starts, launch.data.position).

        Yields features [b, ...], labels [b, ...] and the examples' positions int64 [b]
        (b = part.size), in the order of launch.data.order, whatever the readers.
        """
        p = self._pipeline(part.size, training=True, repeat=False, skipped=skipped)
        with tf.device("/cpu:0"), tf.name_scope("input"), _not_autographed():
            dataset = self.positioned(spec, p, part, tf.cast(start, tf.int64),
                                      tf.cast(batches, tf.int64))
            return dataset.with_options(self._options())

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
        on /cpu:0 of the default graph. training: the training data from its first
        position, reader ``shard`` taking its B of every shard[1] * B (one epoch unless
        ``repeat``); else the evaluation data in order, its last batch holding what is
        left unless the stream repeats. skipped: where records left out under
        data.on_bad_record: skip are counted (None: nowhere); with ``fail`` they raise
        DataError."""
        if training:
            index, count = shard
            part = BatchPart(batch_size * count, batch_size * index, batch_size)
            batches = NO_END if repeat else self.examples(spec) // part.global_batch
            dataset = self.training_dataset(spec, part, 0, batches, skipped)
            with _not_autographed():
                return dataset.map(lambda features, labels, positions: (features, labels))
        p = self._pipeline(batch_size, training=False, repeat=repeat, skipped=skipped)
        with tf.device("/cpu:0"), tf.name_scope("input"), _not_autographed():
            batches = self.batches(spec, p).with_options(self._options())
            return batches.map(lambda features, labels, keys: (features, labels))

    def _pipeline(self, batch_size: int, *, training: bool, repeat: bool,
                  skipped: SkippedRecords | None) -> Pipeline:
        """The options every format reads with."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise DataError(f"batch_size must be a positive int, got {batch_size!r}")
        cfg = self.cfg
        if not self.skips():
            skipped = None
        elif skipped is None:
            skipped = SkippedRecords(self.where(training), lambda line: None)
        return Pipeline(batch_size, int(cfg.shuffle_buffer),
                        autotune(cfg.num_parallel_calls, "num_parallel_calls"),
                        autotune(cfg.prefetch, "prefetch"), int(cfg.seed), bool(training),
                        bool(repeat), skipped)

    def _options(self) -> tf.data.Options:
        return pipeline_options(None if self.cfg.threads == "auto" else self.cfg.threads)

    def examples(self, spec: InputSpec) -> int:
        """N, the training examples of an epoch (the positions it numbers)."""
        raise NotImplementedError

    def identity(self, spec: InputSpec) -> str:
        """What makes the training data the same data for a resumed job: the source, its
        files and their sizes (a job resumed on other files starts a new epoch)."""
        if self.paths() is None:
            return f"{self.name}: {self.examples(spec)} examples"
        sizes = [f"{name} {file_size(name)}" for name in self.files()]
        return f"{self.name}: {'; '.join(sizes)}"

    def positioned(self, spec: InputSpec, p: Pipeline, part: BatchPart, start: tf.Tensor,
                   batches: tf.Tensor) -> tf.data.Dataset:
        """The format's training pipeline (training_dataset's batches, with positions)."""
        raise NotImplementedError

    def batches(self, spec: InputSpec, p: Pipeline) -> tf.data.Dataset:
        """The format's evaluation pipeline for the options ``p``: (features, labels,
        keys) batches, keys int64 [B] saying which examples (unused but by tests)."""
        raise NotImplementedError

    def arrays(self, spec: InputSpec, training: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Every example as checked numpy arrays in the spec's dtypes: features
        [N, *feature_shape], labels [N, *label_shape] (sources held in memory)."""
        raise DataError(f"cannot load arrays from a {self.name!r} source; use 'npz' or 'csv'")


def _not_autographed() -> ag_ctx.ControlStatusCtx:
    """Datasets made inside: the functions they map or filter not converted by AutoGraph.

    Every function a source's pipeline maps or filters is towers' own, written as plain
    graph code (no Python control flow on tensors), so AutoGraph's conversion only costs:
    its first conversion in a process took 0.13-0.47 s of a resnet20 start on a loaded
    2-core CPU, against under 0.01 s without. TensorFlow offers this as a per-function
    decorator (tf.autograph.experimental.do_not_convert); the status it sets is the one
    every dataset function made inside this context reads, so one place covers them all.
    """
    return ag_ctx.ControlStatusCtx(status=ag_ctx.Status.DISABLED)


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


class InMemory(Source):
    """A source read whole into memory (builtin, npz, csv): its training examples are
    taken by position from its arrays, in the order launch.data.order.EpochOrder gives
    (a permutation of all N a epoch; ``shuffle_buffer: 0`` keeps the stored order)."""

    def __init__(self, cfg: DataConfig) -> None:
        super().__init__(cfg)
        self._held: dict[InputSpec, tuple[np.ndarray, np.ndarray]] = {}

    def training_arrays(self, spec: InputSpec) -> tuple[np.ndarray, np.ndarray]:
        """The training examples, read once: features [N, ...], labels [N, ...]."""
        if spec not in self._held:
            self._held[spec] = self.arrays(spec, training=True)
        return self._held[spec]

    def examples(self, spec: InputSpec) -> int:
        return len(self.training_arrays(spec)[1])

    def positioned(self, spec: InputSpec, p: Pipeline, part: BatchPart, start: tf.Tensor,
                   batches: tf.Tensor) -> tf.data.Dataset:
        features, labels = self.training_arrays(spec)
        order = EpochOrder(len(labels), p.seed, shuffle=p.shuffle_buffer > 0)
        return positioned_arrays(features, labels, spec, order, part, start, batches, p)

    def batches(self, spec: InputSpec, p: Pipeline) -> tf.data.Dataset:
        return array_dataset(*self.arrays(spec, p.training), spec, p)
