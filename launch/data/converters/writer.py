"""Sharded TFRecord output shared by every converter: Example features, the shards,
a progress bar, and the summary of what was written.

Example i goes to shard i % N, so every shard holds a stripe of the whole set and
readers that each take some shards (ps/worker, Horovod) see every class. Each shard
is written under a temporary name and renamed when complete, so a stopped conversion
leaves no half-written shard under a final name. Beside each shard goes its record
index (``launch.data.index_file``), from the offsets counted while writing: a training
start reads it instead of every record's header.
"""

from __future__ import annotations

import os
import sys
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tensorflow as tf
from tqdm import tqdm

from launch.data import index_file
from launch.data.errors import DataError
from launch.data.index_file import FOOTER_BYTES, HEADER_BYTES


def shard_names(out_prefix: str | os.PathLike, num_shards: int) -> list[str]:
    """``out_prefix-00000-of-0000N.tfrecord`` ... for N = num_shards."""
    prefix = os.fspath(out_prefix)
    return [f"{prefix}-{index:05d}-of-{num_shards:05d}.tfrecord" for index in range(num_shards)]


def int64_feature(values: Iterable[int]) -> tf.train.Feature:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=list(values)))


def float_feature(values: Iterable[float]) -> tf.train.Feature:
    return tf.train.Feature(float_list=tf.train.FloatList(value=list(values)))


def bytes_feature(value: bytes) -> tf.train.Feature:
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))


def example(features: dict[str, tf.train.Feature]) -> bytes:
    """One serialized tf.train.Example."""
    return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()


def raw_image_example(pixels: np.ndarray, label: int) -> bytes:
    """An Example of decoded pixels: ``image/raw`` holds the uint8 bytes of pixels
    [height, width, channels] (the ``raw_image`` schema preset)."""
    raw = bytes_feature(np.ascontiguousarray(pixels, np.uint8).tobytes())
    return example({"image/raw": raw, **_image_header(pixels.shape, label)})


def encoded_image_example(encoded: bytes, shape: tuple[int, int, int], label: int,
                          image_format: str, text: str) -> bytes:
    """An Example in the ImageNet layout (the ``imagenet`` schema preset):
    ``image/encoded`` (the JPEG/PNG bytes), ``image/format``, ``image/class/text``."""
    return example({"image/encoded": bytes_feature(encoded),
                    "image/format": bytes_feature(image_format.encode()),
                    "image/class/text": bytes_feature(text.encode()),
                    **_image_header(shape, label)})


def _image_header(shape: tuple[int, ...], label: int) -> dict[str, tf.train.Feature]:
    """image/height, image/width, image/channels and image/class/label."""
    height, width, channels = shape
    return {"image/height": int64_feature([height]), "image/width": int64_feature([width]),
            "image/channels": int64_feature([channels]),
            "image/class/label": int64_feature([label])}


@dataclass
class Summary:
    """What a conversion wrote. data: the job file's data section that reads it;
    model: parameters the model needs for it (vocab_size, num_classes ...);
    extra: other files written (a vocabulary, the class names); notes: anything else
    the user should know (files ignored, the share of unknown words)."""

    files: list[str]
    examples: int
    bytes: int
    data: dict[str, Any]
    model: dict[str, Any] = field(default_factory=dict)
    extra: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"files": self.files, "examples": self.examples, "bytes": self.bytes,
                "data": self.data, "model": self.model, "extra": self.extra,
                "notes": self.notes}

    def lines(self) -> list[str]:
        """The human summary: what was written, and how a job file reads it."""
        size = f"{self.bytes / 2**20:.1f} MiB"
        shown = self.files if len(self.files) <= 3 else [self.files[0], "...", self.files[-1]]
        lines = [f"wrote {self.examples} examples to {len(self.files)} file(s), {size}: "
                 f"{', '.join(shown)}"]
        lines += [f"wrote {name}" for name in self.extra]
        lines += self.notes
        lines.append(f"read it with: data: {_flow(self.data)}")
        if self.model:
            lines.append(f"and set: model: {_flow(self.model)}")
        return lines


def _flow(value: Any) -> str:
    """A YAML flow mapping, on one line."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class ShardedWriter:
    """Writes serialized Examples round-robin into ``num_shards`` files.

    total: the examples expected, for the progress bar (None: unknown). Use as a
    context manager; shards are renamed to their final names only on success.
    """

    def __init__(self, out_prefix: str | os.PathLike, num_shards: int, total: int | None,
                 what: str = "examples"):
        if isinstance(num_shards, bool) or not isinstance(num_shards, int) or num_shards < 1:
            raise DataError(f"--shards must be a positive int, got {num_shards!r}")
        if total is not None and num_shards > total:
            raise DataError(f"{os.fspath(out_prefix)}: {num_shards} shards for only {total} "
                            "examples; use fewer --shards")
        self.names = shard_names(out_prefix, num_shards)
        self.count = 0
        self._total = total
        self._what = what
        self._writers: list[tf.io.TFRecordWriter] = []
        # Each shard's record offsets, counted as written (a record is framed by
        # HEADER_BYTES before its data and FOOTER_BYTES after).
        self._offsets = [array("q") for _ in self.names]
        self._ends = [0] * num_shards
        self.unindexed: str | None = None  # why an index could not be written
        self._bar: Any = None

    def __enter__(self) -> ShardedWriter:
        directory = os.path.dirname(self.names[0])
        if directory:
            tf.io.gfile.makedirs(directory)
        self._writers = [tf.io.TFRecordWriter(f"{name}.partial") for name in self.names]
        # A bar on a terminal only (disable=None): logs of batch jobs stay clean.
        self._bar = tqdm(total=self._total, unit=" " + self._what, file=sys.stderr,
                         disable=None, dynamic_ncols=True, desc="converting")
        return self

    def write(self, record: bytes) -> None:
        shard = self.count % len(self._writers)
        self._writers[shard].write(record)
        self._offsets[shard].append(self._ends[shard])
        self._ends[shard] += HEADER_BYTES + len(record) + FOOTER_BYTES
        self.count += 1
        self._bar.update(1)

    def __exit__(self, kind, value, traceback) -> None:
        self._bar.close()
        for writer in self._writers:
            writer.close()
        if kind is not None:
            for name in self.names:
                if tf.io.gfile.exists(f"{name}.partial"):
                    tf.io.gfile.remove(f"{name}.partial")
            return
        if self.count < len(self.names):
            for name in self.names:
                tf.io.gfile.remove(f"{name}.partial")
            raise DataError(f"{len(self.names)} shards for only {self.count} {self._what}; "
                            "use fewer --shards")
        for name in self.names:
            tf.io.gfile.rename(f"{name}.partial", name, overwrite=True)
        for name, offsets in zip(self.names, self._offsets, strict=True):
            self._write_index(name, np.frombuffer(offsets, np.int64))

    def _write_index(self, name: str, offsets: np.ndarray) -> None:
        """The shard's index beside it, keyed by the shard as renamed (a rename that
        copies, as on GCS, gives it a new time)."""
        try:
            state = index_file.file_state(name, offsets)
        except (OSError, tf.errors.OpError) as err:
            self.unindexed = str(err)
            return
        self.unindexed = index_file.save(name, index_file.StoredIndex(state, offsets)) \
            or self.unindexed

    def summary(self, data: dict[str, Any], model: dict[str, Any] | None = None,
                extra: Sequence[str] = (), notes: Sequence[str] = ()) -> Summary:
        """The summary of a completed conversion; data.path becomes the shards' glob."""
        size = sum(tf.io.gfile.stat(name).length for name in self.names)
        glob = self.names[0].rsplit("-00000-of-", 1)[0] + "-*-of-*.tfrecord"
        if self.unindexed:
            notes = [*notes, f"the record index was not written beside the shards "
                     f"({self.unindexed}); training builds it at its start"]
        return Summary(self.names, self.count, size, {"source": "tfrecord", "path": glob, **data},
                       dict(model or {}), list(extra), list(notes))
