"""``data.source: csv``: files with a header row, a label column (``data.label_column``)
of class ids and ``prod(feature_shape)`` numeric feature columns (``data.feature_columns``,
or every other named column), read and checked whole before training and held in
memory. The rules and the reading are :mod:`launch.data.csv_table`'s."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from launch.data.csv_table import (
    bad_row_error,
    csv_examples,
    label_classes,
    no_examples,
    read_csv,
)
from launch.data.sources.base import DataSpec, Shard, Source, as_spec
from launch.data.stream import Pipeline, array_dataset, files_of_shard, shard_files
from models import InputSpec


class Csv(Source):
    """A reader's share is its files when there are enough of them, else every n-th row.
    Rows left out under data.on_bad_record: skip are logged and counted as the pipeline
    is built, once: they are not part of the data set."""

    name = "csv"
    shards_files = True

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

    def check(self, spec: InputSpec, *, training: bool = True, shard: Shard = (0, 1)) -> None:
        """Every row of this reader's files, naming the first bad one (file, line, column)."""
        files = self.files(training)
        csv_examples(files, spec, self.cfg.label_column, self.cfg.feature_columns,
                     skip=self.skips(), mine=files_of_shard(files, shard))

    def batches(self, spec: InputSpec, p: Pipeline) -> tf.data.Dataset:
        files = self.files(p.training)
        mine, p = shard_files(files, p)
        examples = csv_examples(files, spec, self.cfg.label_column, self.cfg.feature_columns,
                                skip=p.skipped is not None, mine=mine)
        if examples.bad_count:
            p.skipped.skipped([str(row) for row in examples.bad], examples.bad_count)
        return array_dataset(examples.features.reshape(-1, *spec.feature_shape),
                             examples.labels, spec, p)

    def arrays(self, spec: InputSpec, training: bool = True) -> tuple[np.ndarray, np.ndarray]:
        examples = csv_examples(self.files(training), spec, self.cfg.label_column,
                                self.cfg.feature_columns, skip=False)
        return as_spec(examples.features, examples.labels, spec)
