"""TFRecord sources: read ``tf.train.Example`` files by schema, and check them up front.

Numeric features (float, int) and raw pixels (uint8) are parsed a whole batch at a
time by ``parse_example``; encoded images are parsed and decoded one record at a time
(their sizes differ) and then batched. Pixels are then augmented (raw pixels; encoded
ones were cropped while decoding) and normalised a batch at a time. With
``data.on_bad_record: skip`` every record is parsed on its own, so one that fails is
skipped and counted alone (``launch.data.stream.per_record``).
"""

from __future__ import annotations

from collections.abc import Iterator

import tensorflow as tf

from launch.config import ImageConfig
from launch.data import images
from launch.data.errors import DataError
from launch.data.formats import read_error
from launch.data.record_schema import RecordSchema, check_example, legacy_label_key
from launch.data.stream import (
    Pipeline,
    batched,
    checked_labels,
    finish_batch,
    interleave_files,
    per_record,
    shard_files,
)
from models import InputSpec

# check_tfrecord_files parses (and decodes, for images) this many records at the start
# of every file; the CRC of every record is checked regardless.
CHECK_RECORDS = 8


def tfrecord_dataset(files: list[str], schema: RecordSchema, spec: InputSpec,
                     image_cfg: ImageConfig, where: str, p: Pipeline) -> tf.data.Dataset:
    """Batches of features [B, *spec.feature_shape] and labels [B, *spec.label_shape]."""
    files, p = shard_files(files, p)
    records = interleave_files(files, tf.data.TFRecordDataset, p)
    opts = images.image_options(image_cfg, schema.shape, p.training) if schema.pixels else None
    batch = p.batch_size if p.drop_remainder else None

    def seed(number: tf.Tensor) -> tf.Tensor:
        return tf.stack([tf.constant(p.seed, tf.int64), number])

    def labels_of(parsed: dict) -> tf.Tensor:
        labels = parsed[schema.label]
        if schema.label_offset:
            labels -= schema.label_offset
        return checked_labels(labels, spec, where)

    def features_of(parsed: dict) -> tf.Tensor:
        values = parsed[schema.features]
        if schema.kind != "uint8":
            return values
        pixels = tf.io.decode_raw(values, tf.uint8)  # [..., size]: raw bytes of each
        return tf.reshape(pixels, tf.concat([tf.shape(values), schema.shape], axis=0))

    def finish(number: tf.Tensor, features: tf.Tensor, labels: tf.Tensor) -> tuple:
        """A parsed batch -> the model's: raw pixels augmented, pixels normalised."""
        if schema.kind == "uint8":
            features = images.pixels(features, seed(number), opts)
        if opts is not None:
            features = images.normalise(features, opts)
        return finish_batch(features, labels, spec, batch)

    if schema.kind == "image" or p.skipped is not None:
        def parse_one(number: tf.Tensor, record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            parsed = tf.io.parse_single_example(record, schema.parse_spec())
            features = features_of(parsed)
            if schema.kind == "image":
                features = images.decode(features, seed(number), opts)
            return features, labels_of(parsed)

        return per_record(records, p, p.shuffle_buffer, parse_one, finish)

    def parse(number: tf.Tensor, serialized: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        parsed = tf.io.parse_example(serialized, schema.parse_spec())
        return finish(number, features_of(parsed), labels_of(parsed))

    return batched(records, p, p.shuffle_buffer, parse)


# ------------------------------------------------------------------ up-front checks


def records_of(name: str) -> Iterator[bytes]:
    """The records of one file; a corrupt one (bad CRC, truncated) raises DataError
    naming the file and the record index."""
    index = 0
    try:
        for record in tf.compat.v1.io.tf_record_iterator(name):
            yield record
            index += 1
    except tf.errors.DataLossError as err:
        raise DataError(f"{name}: record {index} is corrupt ({err.message})") from None
    except tf.errors.OpError as err:
        raise read_error(name, err) from None


def check_tfrecord_files(files: list[str], schema: RecordSchema) -> int:
    """Read every record (the reader checks their CRCs), check the first CHECK_RECORDS
    of each file against ``schema`` (decoding images); returns the record count."""
    total, encoded = 0, []
    for name in files:
        for index, record in enumerate(records_of(name)):
            total += 1
            if index >= CHECK_RECORDS:
                continue
            feature = check_example(f"{name}: record {index}", record, schema)
            if schema.kind == "image":
                encoded.append((f"{name}: record {index}", feature.bytes_list.value[0]))
    if schema.kind == "image":
        images.check_decodes(encoded, schema.shape[2])
    return total


def first_record(files: list[str], where: str) -> tuple[str, bytes]:
    """(where, record) of the first record found in ``files``."""
    for name in files:
        records = records_of(name)
        record = next(records, None)
        records.close()
        if record is not None:
            return f"{name}: record 0", record
    raise DataError(f"{where}: no records in any file")


def first_label_key(files: list[str], where: str) -> str:
    """The layout without a schema: 'label' or 'labels', from the first record."""
    return legacy_label_key(*first_record(files, where))


def check_first_record(files: list[str], schema: RecordSchema, where: str) -> None:
    """The cheap check make_dataset does: the first record matches the schema."""
    check_example(*first_record(files, where), schema)
