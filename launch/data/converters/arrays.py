"""A job's npz or CSV data set to sharded TFRecords (``towers data convert -c job.yaml``).

Each example becomes a ``tf.train.Example`` with the flattened ``features`` (a float
list, or an int64 list for integer specs) and ``label`` (scalar labels) or ``labels``
(sequence labels) as an int64 list: the layout ``data.source: tfrecord`` reads without
a schema.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from launch.data.converters.writer import (
    ShardedWriter,
    Summary,
    example,
    float_feature,
    int64_feature,
)
from launch.data.formats import PathArg
from launch.data.pipeline import load_arrays
from models import InputSpec


def convert_arrays(source: str, spec: InputSpec, path: PathArg, out_prefix: str | os.PathLike,
                   num_shards: int, label_column: str = "label",
                   feature_columns: Sequence[str] | None = None) -> Summary:
    """Write the examples of an npz/CSV ``source`` to ``num_shards`` TFRecord files.

    features [N, *feature_shape] and labels [N, *label_shape] are checked against
    ``spec`` as training would (a CSV's columns: ``label_column``, ``feature_columns``).
    Raises DataError.
    """
    features, labels = load_arrays(source, spec, path, label_column, feature_columns)
    label_key = "label" if labels.ndim == 1 else "labels"
    with ShardedWriter(out_prefix, num_shards, len(features)) as writer:
        for example_features, example_labels in zip(features, labels, strict=True):
            writer.write(_example(example_features, example_labels, label_key))
    return writer.summary({})


def _example(features: np.ndarray, labels: np.ndarray, label_key: str) -> bytes:
    """One serialized Example: features [...] flattened, labels [...] flattened.

    A Python loop calls this per example: every Example is its own protobuf message,
    there is no batch serializer for ``tf.train.Example``.
    """
    flat = features.ravel().tolist()
    feature = (int64_feature(flat) if np.issubdtype(features.dtype, np.integer)
               else float_feature(flat))
    return example({"features": feature, label_key: int64_feature(labels.ravel().tolist())})
