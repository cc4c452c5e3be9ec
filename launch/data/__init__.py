"""Input data: a source object per data format, tf.data pipelines, TFRecord schemas,
images, converters.

    sources     one module per data.source (synthetic, builtin, npz, csv, tfrecord): what
                each gives, checks and reads (``Source``); ``source_of(job.data)``
    pipeline    make_dataset / check_source / load_arrays by source name and options;
                input_tensors, a dataset's batch as tensors
    order, record_order   the order of the examples in every epoch (in memory; TFRecord)
    position    which positions each global step and each process take; where the
                data's passes end
    record_index, record_stream   TFRecord records from any position on
    index_file  the record index kept beside each TFRecord file, and when it is stale
    stream      the stages pipelines share: evaluation files, batching, per-record
    record_schema  TFRecord feature schemas (data.schema) and records checked against them
    images      decode, augmentation, centre crop, normalisation (data.image)
    infer       the input spec the data implies; a model's and the data's checked together
    formats     paths and globs
    csv_table   CSV files, read and checked whole, row by row
    skips       bad records: named and counted when skipped, one clear error otherwise
    errors      DataError, the one error of every source
    converters  `towers data convert`: the formats people have, to sharded TFRecords
"""

from launch.data.errors import DataError
from launch.data.formats import describe, resolve_files
from launch.data.infer import check_agreement, data_spec, resolve_input_spec
from launch.data.pipeline import check_source, input_tensors, load_arrays, make_dataset
from launch.data.skips import SkippedRecords, input_errors, ordinal
from launch.data.sources import SOURCES, DataSpec, Source, source_of
from launch.data.sources.builtin import builtin_arrays

__all__ = [
    "SOURCES",
    "DataError",
    "DataSpec",
    "SkippedRecords",
    "Source",
    "builtin_arrays",
    "check_agreement",
    "check_source",
    "data_spec",
    "describe",
    "input_errors",
    "input_tensors",
    "load_arrays",
    "make_dataset",
    "ordinal",
    "resolve_files",
    "resolve_input_spec",
    "source_of",
]
