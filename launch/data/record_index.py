"""Where each record of a TFRecord file starts, so a reader can begin at any record
without reading those before it.

A TFRecord record is framed as: its length (uint64, little-endian), a checksum of the
length (uint32), the data, a checksum of the data (uint32). Building an index reads
only the 12-byte headers and seeks past the data: 0.3 to 1.6 s for 1 GiB of 8,192
records on a 2-core VM, against about 10 ms to read the kept index (BENCHMARKS.md).
It is built once and kept beside its file (``launch.data.index_file``; ``towers data
convert`` writes it with the shards), so later starts read one small file instead.
Checksums are the up-front check's business
(``launch.data.sources.tfrecord.check_tfrecord_files``); a header that runs past the
end of its file is a DataError here.
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from launch.data import index_file
from launch.data.errors import DataError
from launch.data.formats import file_size, read_error
from launch.data.index_file import FOOTER_BYTES, HEADER_BYTES, StoredIndex
from launch.log import debug


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


def index_files(files: list[str], where: str) -> RecordIndex:
    """The index of every file of source ``where``: each read from beside its file
    while it matches it, else built from the headers and kept beside the file where
    the directory is local and writable (elsewhere built at each start, as a debug
    line says)."""
    found, built, unkept = [], 0, None
    for name in files:
        stored = index_file.load(name)
        if stored is None:
            stored = build_index(name)
            built += 1
            reason = keep(name, stored)
            unkept = unkept or reason
        found.append(stored)
    note = f"; not kept beside the files ({unkept})" if unkept else ""
    debug(f"{where}: record index: {len(files) - built} file(s) read from beside them, "
          f"{built} built from their headers{note}")
    return RecordIndex(tuple(files), tuple(s.offsets for s in found),
                       tuple(s.state.size for s in found))


def build_index(name: str) -> StoredIndex:
    """The index of file ``name`` from its headers, keyed by the file's state as it
    was before they were read (a file changed meanwhile is found stale next time)."""
    try:
        before = index_file.file_state(name)
        offsets = record_offsets(name, before.size)
        frame = index_file.file_state(name, offsets).last_frame
    except (OSError, tf.errors.OpError) as err:
        raise read_error(name, err) from None
    return StoredIndex(dataclasses.replace(before, last_frame=frame), offsets)


def keep(name: str, index: StoredIndex) -> str | None:
    """Write ``index`` beside its file where a start may: a local directory only (a
    gs:// dataset is not written to by training). Returns why not, or None."""
    if not index_file.is_local(name):
        return "not a local directory"
    return index_file.save(name, index)


def record_offsets(name: str, size: int | None = None) -> np.ndarray:
    """The byte offset of each record of TFRecord file ``name``, int64 [records], in
    its first ``size`` bytes (default: the whole file)."""
    size = file_size(name) if size is None else size
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
