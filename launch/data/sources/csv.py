"""``data.source: csv``: files with a header row, a label column (``data.label_column``)
of class ids and ``prod(feature_shape)`` numeric feature columns (``data.feature_columns``,
or every other named column), read and checked whole before training and held in
memory. The rules and the reading are :mod:`launch.data.csv_table`'s."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from launch.data.csv_table import (
    CsvExamples,
    bad_row_error,
    csv_examples,
    label_classes,
    no_examples,
    read_csv,
)
from launch.data.position import BatchPart
from launch.data.sources.base import DataSpec, InMemory, as_spec
from launch.data.stream import Pipeline
from models import InputSpec


class Csv(InMemory):
    """Every file read whole, its rows held in memory. Rows left out under
    data.on_bad_record: skip are logged and counted as the pipeline is built, once:
    they are not part of the data set (nor of its positions)."""

    name = "csv"

    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        self._bad: dict[bool, CsvExamples] = {}  # by training: the rows skip left out

    def data_spec(self) -> DataSpec:
        """The feature columns give the features' shape, the labels the class count.
        Under ``data.on_bad_record: fail`` a bad row is reported here, before the class
        count it would otherwise skew is compared with the model's."""
        cfg = self.cfg
        table = read_csv(self.files(), cfg.label_column, cfg.feature_columns)
        if table.bad and not self.skips():
            raise bad_row_error(table, table.bad[0], sum(table.bad_counts))
        found = label_classes(table)
        if found is None:
            raise no_examples(self.where(), table.bad, sum(table.bad_counts))
        classes, source = cfg.num_classes, "data.num_classes"
        if cfg.num_classes is None:
            classes, source = found[0], f"the largest label, {found[0] - 1}, at {found[1]}"
        return DataSpec(self.where(), (len(table.feature_columns),), tf.float32, (), classes,
                        source)

    def check(self, spec: InputSpec, *, training: bool = True) -> None:
        """Every row of every file, naming the first bad one (file, line, column); the
        training rows are then held for the pipeline (read once)."""
        if training:
            self.training_arrays(spec)
        else:
            self._examples(spec, training)

    def positioned(self, spec: InputSpec, p: Pipeline, part: BatchPart, start: tf.Tensor,
                   batches: tf.Tensor) -> tf.data.Dataset:
        dataset = super().positioned(spec, p, part, start, batches)
        self._name_skipped(True, p)
        return dataset

    def batches(self, spec: InputSpec, p: Pipeline) -> tf.data.Dataset:
        dataset = super().batches(spec, p)
        self._name_skipped(False, p)
        return dataset

    def arrays(self, spec: InputSpec, training: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Every good row (under data.on_bad_record: skip the bad ones are left out, and
        named when the pipeline is built)."""
        examples = self._examples(spec, training)
        return as_spec(examples.features.reshape(-1, *spec.feature_shape), examples.labels,
                       spec)

    def _examples(self, spec: InputSpec, training: bool) -> CsvExamples:
        examples = csv_examples(self.files(training), spec, self.cfg.label_column,
                                self.cfg.feature_columns, skip=self.skips())
        if examples.bad_count:
            self._bad[training] = examples
        return examples

    def _name_skipped(self, training: bool, p: Pipeline) -> None:
        """The rows left out of the data read for ``training``, logged and counted."""
        bad = self._bad.get(training)
        if p.skipped is not None and bad is not None:
            p.skipped.skipped([str(row) for row in bad.bad], bad.bad_count)
