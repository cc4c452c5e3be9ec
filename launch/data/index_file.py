"""The record index kept beside each TFRecord file, so a start reads one small file
instead of every record's header (launch.data.record_index builds, loads and keeps it).

File ``DIR/NAME`` keeps its index in ``DIR/.NAME.towers-index``. Hidden, so other
tools' globs (``train-*``) do not pick it up; towers' own globs leave it out
(``launch.data.formats``), as TensorFlow's glob matches hidden files too. One index per
file, not one per source: a source is any list or glob of files and one file may be in
several, while a file's offsets depend on that file alone; so a glob over some of the
shards, or one shard rewritten, reuses or rebuilds just those files' indexes.

The format, little-endian: MAGIC; a header (the length of the name, the file's size,
its modification time in ns, its record count); the file's base name (UTF-8); the
last record's frame (its 12-byte header and its data's 4-byte checksum, zeros for no
records); the records' byte offsets, int64 [records]; a CRC-32 of all that.

An index is trusted only while it matches its file: the same base name, size and
modification time, and the same last record's frame read from the file (one small
read). The frame catches what the time may miss: a rewrite of the same size within
the clock's granularity (a kernel tick on Linux, a second on some filesystems).
"""

from __future__ import annotations

import os
import struct
import uuid
import zlib
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

SUFFIX = ".towers-index"
MAGIC = b"TWRINDX1"
_HEADER = struct.Struct("<IQqQ")  # name length, size, mtime_ns, records
# A TFRecord record's frame around its data (launch.data.record_index reads it).
HEADER_BYTES = 12  # length (8) and its checksum (4)
FOOTER_BYTES = 4  # the data's checksum
FRAME_BYTES = HEADER_BYTES + FOOTER_BYTES  # kept of the last record: its header, its checksum
_CRC = struct.Struct("<I")


def index_path(name: str) -> str:
    """Where the index of TFRecord file ``name`` is kept: ``DIR/.NAME.towers-index``."""
    directory, base = os.path.split(name)
    return os.path.join(directory, f".{base}{SUFFIX}")


def is_index_file(name: str) -> bool:
    """Whether ``name`` is an index (or one being written): never data."""
    return SUFFIX in os.path.basename(name)


def is_local(name: str) -> bool:
    return "://" not in name


@dataclass(frozen=True)
class FileState:
    """What an index is keyed by: the file's base name, size (bytes), modification
    time (ns) and its last record's frame (FRAME_BYTES, empty without records)."""

    name: str
    size: int
    mtime_ns: int
    last_frame: bytes


@dataclass(frozen=True)
class StoredIndex:
    """An index as kept: the state of the file it was made from, and the byte offset
    of each of its records, int64 [records]."""

    state: FileState
    offsets: np.ndarray

    def matches(self, state: FileState) -> bool:
        """The staleness rule: trusted only while the file is as it was."""
        return self.state == state


def encode(index: StoredIndex) -> bytes:
    """The bytes of an index file."""
    state = index.state
    name = state.name.encode()
    body = b"".join([MAGIC, _HEADER.pack(len(name), state.size, state.mtime_ns,
                                         len(index.offsets)),
                     name, state.last_frame.ljust(FRAME_BYTES, b"\0"),
                     np.asarray(index.offsets, "<i8").tobytes()])
    return body + _CRC.pack(zlib.crc32(body))


def decode(data: bytes) -> StoredIndex | None:
    """The index in ``data``; None if it is not one, cut short, corrupt (its CRC) or
    inconsistent (offsets not increasing from 0 within the file)."""
    start = len(MAGIC) + _HEADER.size
    if len(data) < start + _CRC.size or not data.startswith(MAGIC):
        return None
    body, (crc,) = data[:-_CRC.size], _CRC.unpack(data[-_CRC.size:])
    if zlib.crc32(body) != crc:
        return None
    name_len, size, mtime_ns, records = _HEADER.unpack_from(data, len(MAGIC))
    frame_at = start + name_len
    offsets_at = frame_at + FRAME_BYTES
    if len(body) != offsets_at + 8 * records:
        return None
    offsets = np.frombuffer(body, "<i8", records, offsets_at).astype(np.int64)
    if records and (offsets[0] != 0 or offsets[-1] >= size or np.any(np.diff(offsets) <= 0)):
        return None
    frame = body[frame_at:offsets_at] if records else b""
    state = FileState(body[start:frame_at].decode(errors="replace"), size, mtime_ns, frame)
    return StoredIndex(state, offsets)


# ------------------------------------------------------------------ the files


def file_state(name: str, offsets: np.ndarray | tuple = ()) -> FileState:
    """The state of file ``name`` now, its last record's frame read where ``offsets``
    (int64 [records]) say it starts. Raises OSError or tf.errors.OpError when the file
    cannot be read."""
    if is_local(name):
        # os.stat: TensorFlow's stat rounds a local file's time to the second.
        info = os.stat(name)
        size, mtime_ns = info.st_size, info.st_mtime_ns
    else:
        info = tf.io.gfile.stat(name)
        size, mtime_ns = info.length, info.mtime_nsec
    frame = b""
    if len(offsets) and 0 <= offsets[-1] <= size - FRAME_BYTES:
        with tf.io.gfile.GFile(name, "rb") as raw:
            raw.seek(int(offsets[-1]))
            header = raw.read(HEADER_BYTES)
            raw.seek(size - FOOTER_BYTES)
            frame = header + raw.read(FOOTER_BYTES)
    return FileState(os.path.basename(name), size, mtime_ns, frame)


def load(name: str) -> StoredIndex | None:
    """The index kept beside ``name`` if there is one and it matches the file now;
    None if missing, unreadable or stale."""
    try:
        with tf.io.gfile.GFile(index_path(name), "rb") as kept:
            stored = decode(kept.read())
        return stored if stored and stored.matches(file_state(name, stored.offsets)) else None
    except (OSError, tf.errors.OpError):
        return None


def save(name: str, index: StoredIndex) -> str | None:
    """Keep ``index`` beside ``name``: written to a temporary name and renamed, so a
    reader (another worker starting at the same time) never sees half of one. Returns
    None, or why it could not be written."""
    path = index_path(name)
    temp = f"{path}.{os.getpid()}-{uuid.uuid4().hex[:8]}.partial"
    try:
        with tf.io.gfile.GFile(temp, "wb") as out:
            out.write(encode(index))
        tf.io.gfile.rename(temp, path, overwrite=True)
    except (OSError, tf.errors.OpError) as err:
        _remove_quietly(temp)
        return err.message if isinstance(err, tf.errors.OpError) else str(err)
    return None


def _remove_quietly(path: str) -> None:
    try:
        tf.io.gfile.remove(path)
    except (OSError, tf.errors.OpError):
        pass  # never created, or the directory refuses it too: nothing to clean up
