"""``data.source: tfrecord``: sharded files of ``tf.train.Example``, read in parallel by
schema (``data.schema``, :mod:`launch.data.record_schema`), and checked up front.

Without a schema a record holds a ``features`` float list (int64 for integer specs) and
a ``label`` or ``labels`` int64 list, the layout ``towers data convert -c job.yaml``
writes.

Numeric features (float, int) and raw pixels (uint8) are parsed a whole batch at a
time by ``parse_example``; encoded images are parsed and decoded one record at a time
(their sizes differ) and then batched. Pixels are then augmented (raw pixels; encoded
ones were cropped while decoding) and normalised a batch at a time. With
``data.on_bad_record: skip`` every record is parsed on its own, so one that fails is
skipped, named and counted alone (``launch.data.stream.per_record``).

Before training every record of every file is read (the reader checks its CRC) and
checked against the schema; images are decoded in the first CHECK_RECORDS records of
each file. So mid-run only an image that does not decode can fail, and it is named by
its file and record. Records are counted from 0 in every message.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import tensorflow as tf

from launch.config import PIXEL_KINDS, ImageConfig
from launch.data import checked_records, images
from launch.data.errors import DataError
from launch.data.formats import describe, read_error
from launch.data.position import BatchPart
from launch.data.record_index import RecordIndex, index_files
from launch.data.record_order import RecordOrder
from launch.data.record_schema import (
    LEGACY_LABEL_KEYS,
    RecordSchema,
    check_example,
    legacy_label_key,
    legacy_schema,
    parse_example_proto,
    record_schema,
)
from launch.data.record_stream import ordered_records, part_of_batches
from launch.data.skips import RecordGaps
from launch.data.sources.base import DataSpec, Source
from launch.data.stream import (
    ORIGIN_FILE,
    Pipeline,
    batched,
    checked_labels,
    finish_batch,
    interleave_files,
    per_record,
)
from models import InputSpec

# check_tfrecord_files parses (and decodes, for images) this many records at the start
# of every file; the CRC of every record is checked regardless.
CHECK_RECORDS = 8


class TfRecord(Source):
    """Records laid out as data.schema says: numeric lists, raw pixels or encoded JPEG/PNG
    images (decoded, augmented and normalised as data.image says), in the order of
    launch.data.record_order; every reader reads every file and parses its part."""

    name = "tfrecord"
    _index: RecordIndex | None = None

    def data_spec(self) -> DataSpec:
        """data.schema's shapes, dtypes and classes; without one, the first record's."""
        schema = self.cfg.schema
        if schema is None:
            return _first_record_spec(self.files(), describe(self.paths(), self.files()))
        return DataSpec("data.schema", schema.shape,
                        tf.int32 if schema.kind == "int" else tf.float32, schema.label_shape,
                        schema.num_classes, exact=schema.kind in PIXEL_KINDS)

    def record_schema(self, files: list[str], spec: InputSpec, where: str) -> RecordSchema:
        """How to read each record for ``spec``: data.schema, or the layout without one."""
        if self.cfg.schema is None:
            return legacy_schema(spec, first_label_key(files, where))
        return record_schema(self.cfg.schema, spec)

    def check(self, spec: InputSpec, *, training: bool = True) -> None:
        """Every record of every file (CRCs, the schema; images decoded in the first
        CHECK_RECORDS of each), naming the file and record of a bad one."""
        paths, files = self.paths(training), self.files(training)
        where = describe(paths, files)
        schema = self.record_schema(files, spec, where)
        clean = check_tfrecord_files(files, schema, where, skip=self.skips())
        if training:
            self.index()  # kept beside the files (once their records are known sound)
        checked_records.remember(clean, schema)  # by the kept index's state of each

    def index(self) -> RecordIndex:
        """Where each training record starts (read once: launch.data.record_index)."""
        if self._index is None:
            self._index = index_files(self.files(), self.where())
        return self._index

    def examples(self, spec: InputSpec) -> int:
        return self.index().total

    def batches(self, spec: InputSpec, p: Pipeline) -> tf.data.Dataset:
        """The evaluation records, file after file."""
        parser = self._parser(spec, p)
        return parser.batches(interleave_files(parser.files, tf.data.TFRecordDataset), p)

    def positioned(self, spec: InputSpec, p: Pipeline, part: BatchPart, start: tf.Tensor,
                   batches: tf.Tensor) -> tf.data.Dataset:
        """The training records in order from ``start``, this reader's part parsed."""
        parser = self._parser(spec, p)
        records = ordered_records(RecordOrder(self.index(), p.seed, p.shuffle_buffer),
                                  start, p)
        mine = part_of_batches(records, part, start)
        return parser.batches(mine, p).take(batches)

    def _parser(self, spec: InputSpec, p: Pipeline) -> RecordParser:
        """The cheap check first (the first record matches the schema), then the parser."""
        files = self.files(p.training)
        where = describe(self.paths(p.training), files)
        schema = self.record_schema(files, spec, where)
        check_first_record(files, schema, where)
        return RecordParser(files, schema, spec, self.cfg.image, where, p)


def _first_record_spec(files: list[str], where: str) -> DataSpec:
    """What a TFRecord without a schema says: the first record's list lengths and kinds."""
    where, record = first_record(files, where)
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


class RecordParser:
    """Records -> the model's batches: features [B, *spec.feature_shape], labels
    [B, *spec.label_shape] and the examples' keys int64 [B] (their positions, which
    seed their augmentation)."""

    def __init__(self, files: list[str], schema: RecordSchema, spec: InputSpec,
                 image_cfg: ImageConfig, where: str, p: Pipeline):
        self.files, self.schema, self.spec, self.where = files, schema, spec, where
        self.seed = p.seed
        self.opts = images.image_options(image_cfg, schema.shape, p.training) \
            if schema.pixels else None
        self.batch = p.batch_size if p.drop_remainder else None

    def batches(self, records: tf.data.Dataset, p: Pipeline) -> tf.data.Dataset:
        """(key, origin, record) triples -> batches: a whole batch parsed at once, or
        each record on its own (images of varying sizes; data.on_bad_record: skip)."""
        if self.schema.kind == "image" or p.skipped is not None:
            gaps = RecordGaps(lambda origin: name_record(self.files, self.schema, origin),
                              p.skipped)
            return per_record(records, p, self.parse_one, self.finish, gaps)
        return batched(records, p, self.parse)

    def parse(self, keys: tf.Tensor, records: tf.Tensor) -> tuple[tf.Tensor, ...]:
        parsed = tf.io.parse_example(records, self.schema.parse_spec())
        return self.finish(keys, self._features(parsed), self._labels(parsed))

    def parse_one(self, key: tf.Tensor, record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        parsed = tf.io.parse_single_example(record, self.schema.parse_spec())
        features = self._features(parsed)
        if self.schema.kind == "image":
            seed = tf.stack([tf.constant(self.seed, tf.int64), key])
            features = images.decode(features, seed, self.opts)
        if self.schema.kind == "float":  # a record the up-front check found: left out
            features = tf.debugging.check_numerics(features, "not a finite number")
        return features, self._labels(parsed)

    def finish(self, keys: tf.Tensor, features: tf.Tensor, labels: tf.Tensor
               ) -> tuple[tf.Tensor, ...]:
        """A parsed batch -> the model's: raw pixels augmented, pixels normalised."""
        if self.schema.kind == "uint8":
            features = images.pixels(features, keys, self.seed, self.opts)
        if self.opts is not None:
            features = images.normalise(features, self.opts)
        return (*finish_batch(features, labels, self.spec, self.batch), keys)

    def _labels(self, parsed: dict) -> tf.Tensor:
        labels = parsed[self.schema.label]
        if self.schema.label_offset:
            labels -= self.schema.label_offset
        return checked_labels(labels, self.spec, self.where)

    def _features(self, parsed: dict) -> tf.Tensor:
        values = parsed[self.schema.features]
        if self.schema.kind != "uint8":
            return values
        pixels = tf.io.decode_raw(values, tf.uint8)  # [..., size]: raw bytes of each
        return tf.reshape(pixels, tf.concat([tf.shape(values), self.schema.shape], axis=0))


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


def check_tfrecord_files(files: list[str], schema: RecordSchema, where: str,
                         skip: bool = False) -> dict[str, int]:
    """Read every record of ``files`` (the reader checks their CRCs) and check each
    against ``schema``, decoding the images of the first CHECK_RECORDS of each file;
    a file checked clean at an earlier start and unchanged since is not read again
    (launch.data.checked_records).
    A bad record is a DataError naming its file and record, unless ``skip``: then the
    pipeline leaves it out; no good record in any file is a DataError naming ``where``.
    Returns the files read now and found clean, with their record counts, for
    launch.data.checked_records to remember."""
    before = checked_records.recalled(files, schema)
    good, bad, first_bad, encoded = sum(before.values()), 0, None, []
    clean = {}
    for name in files:
        if name in before:
            continue
        file_good, file_bad = 0, 0
        for index, record in enumerate(records_of(name)):
            try:
                feature = check_example(f"{name}: record {index}", record, schema)
            except DataError as err:
                if not skip:
                    raise
                file_bad, first_bad = file_bad + 1, first_bad or err
                continue
            file_good += 1
            if schema.kind == "image" and index < CHECK_RECORDS and not skip:
                encoded.append((f"{name}: record {index}", feature.bytes_list.value[0]))
        good, bad = good + file_good, bad + file_bad
        if file_good and not file_bad:
            clean[name] = file_good
    if schema.kind == "image":
        images.check_decodes(encoded, schema.shape[2])
    if not good:
        raise DataError(f"{where}: no examples: " + (
            f"all {bad} records are bad, e.g. {first_bad}" if bad else "no records in any file"))
    return clean


def name_record(files: list[str], schema: RecordSchema, origin: int) -> str:
    """What is wrong with the record at ``origin`` (file index * ORIGIN_FILE + index),
    and where it is: read again and checked, or, if it passes, that it does not decode."""
    name, index = files[origin // ORIGIN_FILE], origin % ORIGIN_FILE
    where = f"{name}: record {index}"
    records = records_of(name)
    try:
        record = next(itertools.islice(records, index, None), None)
        if record is not None:
            check_example(where, record, schema)
    except DataError as err:
        return str(err)
    finally:
        records.close()
    if schema.kind == "image":
        return f"{where}: {schema.features!r} does not decode as an image"
    return f"{where} failed to parse"


def first_record(files: list[str], where: str) -> tuple[str, bytes]:
    """(where, record) of the first record found in ``files``."""
    for name in files:
        records = records_of(name)
        record = next(records, None)
        records.close()
        if record is not None:
            return f"{name}: record 0", record
    raise DataError(f"{where}: no examples: no records in any file")


def first_label_key(files: list[str], where: str) -> str:
    """The layout without a schema: 'label' or 'labels', from the first record."""
    return legacy_label_key(*first_record(files, where))


def check_first_record(files: list[str], schema: RecordSchema, where: str) -> None:
    """The cheap check a pipeline makes as it is built: the first record matches the
    schema."""
    check_example(*first_record(files, where), schema)
