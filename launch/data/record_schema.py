"""TFRecord feature schemas: what each ``tf.train.Example`` holds, and records checked
against it before training.

A ``RecordSchema`` is ``data.schema`` (launch.config.data_options) with its nulls filled
in from the input spec, or, without ``data.schema``, the project's original layout: a
flat ``features`` list (floats, or int64 for integer specs) and ``label`` (or
``labels``) int64 values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import tensorflow as tf
from google.protobuf.message import DecodeError

from launch.config import PIXEL_KINDS, RecordSchemaConfig
from launch.data.errors import DataError
from models import InputSpec

# How each kind is stored in a tf.train.Feature.
_LIST_OF_KIND = {"float": "float_list", "int": "int64_list", "uint8": "bytes_list",
                 "image": "bytes_list"}
LEGACY_LABEL_KEYS = ("label", "labels")


@dataclass(frozen=True)
class RecordSchema:
    """How to read one Example. shape: the stored features' per-example shape (for
    ``image``, the size images are decoded and resized to); label_offset is subtracted
    from stored labels, which must then lie in [0, num_classes)."""

    features: str
    kind: str
    shape: tuple[int, ...]
    label: str
    label_shape: tuple[int, ...]
    label_offset: int
    num_classes: int

    @property
    def pixels(self) -> bool:
        """Images (encoded or raw): data.image decodes, augments and normalises them."""
        return self.kind in PIXEL_KINDS

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def parse_spec(self) -> dict[str, tf.io.FixedLenFeature]:
        """The tf.io features of ``parse_example``: features [*shape] (bytes: []) and
        labels [*label_shape] int64."""
        if self.kind in PIXEL_KINDS:
            features = tf.io.FixedLenFeature([], tf.string)
        else:
            dtype = tf.int64 if self.kind == "int" else tf.float32
            features = tf.io.FixedLenFeature(self.shape, dtype)
        return {self.features: features,
                self.label: tf.io.FixedLenFeature(self.label_shape, tf.int64)}

    def describe(self) -> str:
        """For messages: 'image/encoded (image [32, 32, 3]) and image/class/label ([])'."""
        return (f"{self.features!r} ({self.kind} {list(self.shape)}) and {self.label!r} "
                f"(int64 {list(self.label_shape)})")


def legacy_schema(spec: InputSpec, label_key: str) -> RecordSchema:
    """The layout `towers data convert -c job.yaml` writes for npz/csv data."""
    return RecordSchema("features", "int" if spec.int_features else "float",
                        spec.feature_shape, label_key, spec.label_shape, 0, spec.num_classes)


def record_schema(cfg: RecordSchemaConfig, spec: InputSpec) -> RecordSchema:
    """``data.schema`` with shape / num_classes taken from ``spec`` where null.

    The caller has checked that ``spec`` and the schema agree (launch.data.infer).
    """
    shape = cfg.shape if cfg.shape is not None else spec.feature_shape
    if cfg.kind in PIXEL_KINDS and (len(shape) != 3 or shape[2] not in (1, 3)):
        raise DataError(f"data.schema: {cfg.kind} features are images, [height, width, "
                        f"channels] with 1 or 3 channels; the input is {list(shape)} "
                        f"(set data.schema.shape)")
    num_classes = cfg.num_classes if cfg.num_classes is not None else spec.num_classes
    return RecordSchema(cfg.features, cfg.kind, tuple(shape), cfg.label, cfg.label_shape,
                        cfg.label_offset, num_classes)


# ----------------------------------------------------------------- checking records


def check_example(where: str, record: bytes, schema: RecordSchema) -> Any:
    """Check one serialized Example against ``schema``; DataErrors begin with ``where``
    (the file and record). Returns its features' Feature, for the caller's checks."""
    feature_map = parse_example_proto(where, record)
    kind = _LIST_OF_KIND[schema.kind]
    if schema.kind in PIXEL_KINDS:
        values = _check_feature(where, feature_map, schema.features, kind, 1)
        _check_pixels(where, schema, values[0])
    else:
        values = _check_feature(where, feature_map, schema.features, kind, schema.size)
        if schema.kind == "float" and not all(map(math.isfinite, values)):
            bad = next(v for v in values if not math.isfinite(v))
            raise DataError(f"{where}: {schema.features!r} holds {bad}, not a finite number "
                            "(the first step to meet it would diverge)")
    labels = _check_feature(where, feature_map, schema.label, "int64_list",
                            math.prod(schema.label_shape))
    shifted = [label - schema.label_offset for label in labels]
    if shifted and not all(0 <= label < schema.num_classes for label in shifted):
        offset = f" after subtracting label_offset {schema.label_offset}" if (
            schema.label_offset) else ""
        raise DataError(f"{where}: {schema.label!r} holds {list(labels)[:8]}, outside "
                        f"[0, {schema.num_classes}){offset}")
    return feature_map[schema.features]


def parse_example_proto(where: str, record: bytes) -> Any:
    """The feature map of a serialized tf.train.Example."""
    try:
        return tf.train.Example.FromString(record).features.feature
    except DecodeError as err:
        raise DataError(f"{where} is not a tf.train.Example: {err}") from None


def legacy_label_key(where: str, record: bytes) -> str:
    """'label' or 'labels', whichever the record has (the layout without a schema)."""
    feature_map = parse_example_proto(where, record)
    for key in LEGACY_LABEL_KEYS:
        if key in feature_map:
            return key
    raise DataError(f"{where} has no 'label' or 'labels' feature (has {sorted(feature_map)}); "
                    "for other layouts set data.schema")


def _check_pixels(where: str, schema: RecordSchema, value: bytes) -> None:
    if schema.kind == "uint8" and len(value) != schema.size:
        raise DataError(f"{where}: {schema.features!r} holds {len(value)} bytes, the schema's "
                        f"shape {list(schema.shape)} needs {schema.size}")
    if schema.kind == "image" and not value:
        raise DataError(f"{where}: {schema.features!r} is empty, expected an encoded image")


def _check_feature(where: str, feature_map: Any, key: str, kind: str, size: int) -> Any:
    """The values of ``feature_map[key]``, which must be a ``kind`` of ``size`` values."""
    if key not in feature_map:
        shown = sorted(feature_map)
        raise DataError(f"{where} has no {key!r} feature (has {shown}); set data.schema "
                        "to the file's layout")
    found = feature_map[key].WhichOneof("kind")
    if found != kind:
        raise DataError(f"{where}: {key!r} is a {found}, the schema needs a {kind}")
    values = getattr(feature_map[key], kind).value
    if len(values) != size:
        raise DataError(f"{where}: {key!r} has {len(values)} values, the schema needs {size}")
    return values
