"""Input data: tf.data pipelines for every source, TFRecord schemas, images, converters.

    pipeline    make_dataset / check_source / input_tensors for each data.source
    stream      the stages pipelines share: sharding, interleave, batching, per-record
    schema      TFRecord feature schemas (data.schema) and records checked against them
    tfrecord    TFRecord datasets by schema, and their up-front checks
    images      decode, augmentation, centre crop, normalisation (data.image)
    infer       the input spec the data implies; a model's and the data's checked together
    formats     paths and globs; npz files
    csv_table   CSV files, read and checked whole, row by row
    skips       bad records: named and counted when skipped, one clear error otherwise
    builtin     the generated, learnable data set of `data.source: builtin`
    errors      DataError, the one error of every source
    converters  `towers data convert`: the formats people have, to sharded TFRecords
"""

from launch.data.builtin import builtin_arrays
from launch.data.errors import DataError
from launch.data.formats import describe, resolve_files
from launch.data.infer import DataSpec, check_agreement, data_spec, resolve_input_spec
from launch.data.pipeline import SOURCES, check_source, input_tensors, load_arrays, make_dataset
from launch.data.skips import SkippedRecords, input_errors, ordinal
from launch.data.stream import files_of_shard

__all__ = [
    "SOURCES",
    "DataError",
    "DataSpec",
    "SkippedRecords",
    "builtin_arrays",
    "check_agreement",
    "check_source",
    "data_spec",
    "describe",
    "files_of_shard",
    "input_errors",
    "input_tensors",
    "load_arrays",
    "make_dataset",
    "ordinal",
    "resolve_files",
    "resolve_input_spec",
]
