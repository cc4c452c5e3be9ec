"""The input spec the data implies, known without the model, and the two checked.

A model may declare its input (``models.InputSpec``) or leave it to the data. The data
section tells what it will produce as far as it can: a TFRecord schema gives shapes,
dtypes and classes; npz arrays their shapes and dtypes, a CSV source its feature
columns; both give the class count, ``data.num_classes`` or else the largest training
label plus one, which a model must then have; a TFRecord without a schema its first
record's lists; the generated sources nothing (they make whatever the model takes).

    spec = resolve_input_spec("mynet", model.input_spec, job.data)  # None: the data's

Features come as float32 (float lists, images, raw pixels) or int32 (integer lists),
labels as int32, as every built-in model takes them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from launch.config import PIXEL_KINDS, DataConfig
from launch.data.csv_table import bad_row_error, label_classes, no_examples, read_csv
from launch.data.errors import DataError
from launch.data.formats import describe, npz_arrays, resolve_files, single_file
from launch.data.record_schema import LEGACY_LABEL_KEYS, parse_example_proto
from launch.data.tfrecord import first_record
from models import InputSpec


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


def data_spec(cfg: DataConfig) -> DataSpec:
    """What ``cfg`` will produce per example, from the data section and file headers."""
    if cfg.source == "tfrecord" and cfg.schema is not None:
        schema = cfg.schema
        return DataSpec("data.schema", schema.shape,
                        tf.int32 if schema.kind == "int" else tf.float32, schema.label_shape,
                        schema.num_classes, exact=schema.kind in PIXEL_KINDS)
    if cfg.source == "tfrecord":
        return _legacy_tfrecord_spec(cfg)
    if cfg.source == "npz":
        return _npz_spec(single_file(cfg.path, "npz"), cfg.num_classes)
    if cfg.source == "csv":
        return _csv_spec(cfg)
    return DataSpec(f"data.source {cfg.source}")


def _legacy_tfrecord_spec(cfg: DataConfig) -> DataSpec:
    files = resolve_files(cfg.path, "tfrecord")
    where, record = first_record(files, describe(cfg.path, files))
    feature_map = parse_example_proto(where, record)
    if "features" not in feature_map:
        return DataSpec(where)
    kind = feature_map["features"].WhichOneof("kind")
    values = getattr(feature_map["features"], kind).value
    dtype = {"float_list": tf.float32, "int64_list": tf.int32}.get(kind)
    label_key = next((key for key in LEGACY_LABEL_KEYS if key in feature_map), None)
    label_shape = None
    if label_key is not None:
        count = len(feature_map[label_key].int64_list.value)
        label_shape = () if label_key == "label" and count == 1 else (count,)
    return DataSpec(where, (len(values),), dtype, label_shape)


def _npz_spec(name: str, stated: int | None) -> DataSpec:
    """Features of numbers give their dtype, integer labels from 0 their classes."""
    features, labels = npz_arrays(name)
    kind = np.dtype(features[1]).kind
    feature_dtype = {"i": tf.int32, "u": tf.int32, "f": tf.float32}.get(kind)
    classes, source = stated, "data.num_classes"
    if stated is None and labels.size and labels.dtype.kind in "iu" and labels.min() >= 0:
        classes, source = int(labels.max()) + 1, f"the largest label in {name}, {labels.max()}"
    return DataSpec(name, tuple(features[0][1:]), feature_dtype, tuple(labels.shape[1:]),
                    classes, source if classes is not None else "")


def _csv_spec(cfg: DataConfig) -> DataSpec:
    """The feature columns give the features' shape, the labels the class count. Under
    ``data.on_bad_record: fail`` a bad row is reported here, before the class count
    it would otherwise skew is compared with the model's."""
    files = resolve_files(cfg.path, "csv")
    where = describe(cfg.path, files)
    table = read_csv(files, cfg.label_column, cfg.feature_columns)
    if table.bad and cfg.on_bad_record == "fail":
        raise bad_row_error(table, table.bad[0], sum(table.bad_counts))
    found = label_classes(table)
    if found is None:
        raise no_examples(where, table.bad, sum(table.bad_counts))
    classes, source = cfg.num_classes, "data.num_classes"
    if cfg.num_classes is None:
        classes, source = found[0], f"the largest label, {found[0] - 1}, at {found[1]}"
    return DataSpec(where, (len(table.feature_columns),), tf.float32, (), classes, source)


def resolve_input_spec(model_name: str, declared: InputSpec | None,
                       cfg: DataConfig) -> InputSpec:
    """The input spec the job trains with: the model's, checked against the data; or,
    for a model that declares none, the data's. Raises DataError naming both."""
    data = data_spec(cfg)
    if declared is None:
        spec = data.input_spec()
        if spec is None:
            raise DataError(
                f"model {model_name} declares no input_spec and {data.where} does not give "
                f"its {', '.join(data.missing())}: set them in data.schema (a TFRecord "
                f"source) or declare one on {model_name} (a models.InputSpec or a mapping "
                "of its fields)")
        return spec
    check_agreement(model_name, declared, data)
    return declared


def check_agreement(model_name: str, declared: InputSpec, data: DataSpec) -> None:
    """DataError, one line naming the model and the data, if they disagree."""
    problems = []
    if data.feature_shape is not None:
        same = (tuple(data.feature_shape) == declared.feature_shape if data.exact
                else math.prod(data.feature_shape) == declared.num_features)
        if not same:
            problems.append(f"features {list(declared.feature_shape)} vs "
                            f"{list(data.feature_shape)}")
    if data.feature_dtype is not None and (
            data.feature_dtype.is_integer != declared.feature_dtype.is_integer):
        problems.append(f"features {declared.feature_dtype.name} vs {data.feature_dtype.name}")
    if data.label_shape is not None and math.prod(data.label_shape) != declared.num_labels:
        problems.append(f"labels {list(declared.label_shape)} vs {list(data.label_shape)}")
    if data.num_classes is not None and data.num_classes != declared.num_classes:
        problems.append(_classes_problem(declared.num_classes, data))
    if problems:
        raise DataError(f"model {model_name!r} and the data ({data.where}) disagree, model vs "
                        f"data: {'; '.join(problems)}")


def _classes_problem(declared: int, data: DataSpec) -> str:
    """'10 vs 3 classes (...)': with, for classes counted from the labels, where the
    count came from and how to state another."""
    text = f"{declared} vs {data.num_classes} classes"
    if not data.classes_from:
        return text
    if data.classes_from == "data.num_classes":
        return f"{text} (data.num_classes)"
    return (f"{text} ({data.classes_from}; set the model's class count to "
            f"{data.num_classes}, or data.num_classes if the training labels leave out the "
            "last classes)")
