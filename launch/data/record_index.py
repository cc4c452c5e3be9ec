"""Where each record of a TFRecord file starts, so a reader can begin at any record
without reading those before it.

A TFRecord record is framed as: its length (uint64, little-endian), a checksum of the
length (uint32), the data, a checksum of the data (uint32). The index reads only the
12-byte headers and seeks past the data: 0.27 s for 1 GiB of 8,192 records in the
page cache (BENCHMARKS.md). Checksums are the up-front check's business
(``launch.data.sources.tfrecord.check_tfrecord_files``); a header that runs past the
end of its file is a DataError here.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from launch.data.errors import DataError
from launch.data.formats import file_size, read_error

HEADER_BYTES = 12  # length (8) and its checksum (4)
FOOTER_BYTES = 4  # the data's checksum


@dataclass(frozen=True)
class RecordIndex:
    """The records of a source's files: ``offsets[i]``, int64 [records of file i], the
    byte offset of each record of ``files[i]``, whose size is ``sizes[i]`` bytes."""

    files: tuple[str, ...]
    offsets: tuple[np.ndarray, ...]
    sizes: tuple[int, ...]

    @property
    def counts(self) -> np.ndarray:
        """int64 [files]: the records of each file."""
        return np.array([len(o) for o in self.offsets], np.int64)

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def offset(self, file: int, record: int) -> int:
        """The byte offset of ``record`` of file ``file`` (its size, past the last)."""
        offsets = self.offsets[file]
        return int(offsets[record]) if record < len(offsets) else self.sizes[file]


def index_files(files: list[str]) -> RecordIndex:
    """The index of every file (read in order)."""
    return RecordIndex(tuple(files), tuple(record_offsets(name) for name in files),
                       tuple(file_size(name) for name in files))


def record_offsets(name: str) -> np.ndarray:
    """The byte offset of each record of TFRecord file ``name``, int64 [records]."""
    size = file_size(name)
    offsets = []
    position = 0
    try:
        with tf.io.gfile.GFile(name, "rb") as raw:
            while position < size:
                header = raw.read(HEADER_BYTES)
                if len(header) < HEADER_BYTES:
                    break
                (length,) = struct.unpack("<Q", header[:8])
                offsets.append(position)
                position += HEADER_BYTES + length + FOOTER_BYTES
                raw.seek(position)
    except tf.errors.OpError as err:
        raise read_error(name, err) from None
    if position != size:
        raise DataError(f"{name}: record {len(offsets) - 1} is cut short (the file ends at "
                        f"byte {size}, the record at {position})")
    return np.array(offsets, np.int64)
