"""``data.source: npz``: one ``.npz`` file with arrays ``features``/``labels`` (or
``x``/``y``), checked up front against the input spec (its arrays' headers, its labels)
and loaded whole into memory; errors are DataErrors naming the file."""

from __future__ import annotations

import math
import zipfile
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from launch.data.errors import DataError
from launch.data.formats import read_error, single_file
from launch.data.sources.base import DataSpec, InMemory, as_spec
from models import InputSpec

NPZ_KEYS = (("features", "labels"), ("x", "y"))


class Npz(InMemory):
    """Examples [N, ...] of one file, held in memory."""

    name = "npz"

    def file(self, training: bool = True) -> str:
        return single_file(self.paths(training), self.name)

    def data_spec(self) -> DataSpec:
        """Features of numbers give their dtype, integer labels from 0 their classes."""
        name = self.file()
        features, labels = npz_arrays(name)
        kind = np.dtype(features[1]).kind
        feature_dtype = {"i": tf.int32, "u": tf.int32, "f": tf.float32}.get(kind)
        classes, source = self.cfg.num_classes, "data.num_classes"
        if classes is None and labels.size and labels.dtype.kind in "iu" and labels.min() >= 0:
            classes = int(labels.max()) + 1
            source = f"the largest label in {name}, {labels.max()}"
        return DataSpec(name, tuple(features[0][1:]), feature_dtype, tuple(labels.shape[1:]),
                        classes, source if classes is not None else "")

    def check(self, spec: InputSpec, *, training: bool = True) -> None:
        """The arrays' headers (not the arrays) and every label."""
        check_npz(self.file(training), spec)

    def arrays(self, spec: InputSpec, training: bool = True) -> tuple[np.ndarray, np.ndarray]:
        return as_spec(*load_npz(self.file(training), spec), spec)


def _npz_headers(name: str) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """The shape and dtype of every array in an npz, read from the .npy headers only."""
    headers = {}
    try:
        with tf.io.gfile.GFile(name, "rb") as raw:
            if raw.read(4) != b"PK\x03\x04":  # zip local file header; npz has members
                raise DataError(f"{name}: not an npz file (not a zip archive)")
            raw.seek(0)
            archive = zipfile.ZipFile(raw)
            for member in archive.namelist():
                if member.endswith(".npy"):
                    with archive.open(member) as npy:
                        version = np.lib.format.read_magic(npy)
                        read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                                else np.lib.format.read_array_header_2_0)
                        shape, _, dtype = read(npy)
                    headers[member[:-4]] = (shape, dtype)
    except DataError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, tf.errors.OpError) as err:
        raise read_error(name, err) from None
    return headers


def _npz_keys(name: str, available: Sequence[str]) -> tuple[str, str]:
    for keys in NPZ_KEYS:
        if all(key in available for key in keys):
            return keys
    raise DataError(f"{name}: npz needs arrays 'features' and 'labels' (or 'x' and 'y'), "
                    f"has {sorted(available)}")


def _check_array(name: str, what: str, shape: tuple[int, ...], dtype: np.dtype,
                 want_shape: tuple[int, ...], want: tf.DType) -> None:
    """An array [N, ...] must hold prod(want_shape) values an example of dtype kind ``want``."""
    if len(shape) < 1 or math.prod(shape[1:]) != math.prod(want_shape):
        raise DataError(f"{name}: {what} have shape {tuple(shape)}, expected "
                        f"[N, {', '.join(map(str, want_shape))}] (the spec's {what} shape)")
    kinds = "iu" if want.is_integer else "f"
    if dtype.kind not in kinds:
        raise DataError(f"{name}: {what} have dtype {dtype}, the spec wants {want.name}"
                        " (convert, and scale images, before training)")


def _check_npz_meta(name: str, headers: dict, spec: InputSpec) -> tuple[str, str]:
    feature_key, label_key = _npz_keys(name, list(headers))
    (f_shape, f_dtype), (l_shape, l_dtype) = headers[feature_key], headers[label_key]
    if not f_shape or not l_shape or f_shape[0] == 0 or l_shape[0] == 0:
        raise DataError(f"{name}: no examples: {feature_key!r} has shape {tuple(f_shape)}, "
                        f"{label_key!r} {tuple(l_shape)}")
    _check_array(name, "features", f_shape, f_dtype, spec.feature_shape, spec.feature_dtype)
    _check_array(name, "labels", l_shape, l_dtype, spec.label_shape, tf.int64)
    if f_shape[0] != l_shape[0]:
        raise DataError(f"{name}: {f_shape[0]} feature rows but {l_shape[0]} label rows")
    return feature_key, label_key


def _load_npz_array(name: str, key: str) -> np.ndarray:
    try:
        with tf.io.gfile.GFile(name, "rb") as raw, np.load(raw, allow_pickle=False) as npz:
            return npz[key]
    except (OSError, ValueError, zipfile.BadZipFile, tf.errors.OpError) as err:
        raise read_error(name, err) from None


def npz_arrays(name: str) -> tuple[tuple[tuple[int, ...], np.dtype], np.ndarray]:
    """The features' (shape, dtype) from its header, and the labels array, of an npz."""
    headers = _npz_headers(name)
    feature_key, label_key = _npz_keys(name, list(headers))
    return headers[feature_key], _load_npz_array(name, label_key)


def check_npz(name: str, spec: InputSpec) -> None:
    """Every label, and every feature of float features: a NaN or infinite one would make
    the first step holding it diverge, and the learning rate would take the blame."""
    feature_key, label_key = _check_npz_meta(name, _npz_headers(name), spec)
    check_label_values(name, _load_npz_array(name, label_key), spec)
    if not spec.feature_dtype.is_integer:
        check_finite_features(name, _load_npz_array(name, feature_key))


def load_npz(name: str, spec: InputSpec) -> tuple[np.ndarray, np.ndarray]:
    """features [N, *feature_shape], labels [N, *label_shape] from a checked npz."""
    feature_key, label_key = _check_npz_meta(name, _npz_headers(name), spec)
    features, labels = _load_npz_array(name, feature_key), _load_npz_array(name, label_key)
    check_label_values(name, labels, spec)
    return (features.reshape(-1, *spec.feature_shape),
            labels.reshape(-1, *spec.label_shape))


def check_finite_features(name: str, features: np.ndarray) -> None:
    """features [N, ...]: DataError naming the first example (0-based) holding a NaN or
    infinite value, and how many do."""
    finite = np.isfinite(features.reshape(len(features), -1)).all(axis=1)
    if finite.all():
        return
    first = int(np.argmin(finite))
    value = features.reshape(len(features), -1)[first]
    value = value[~np.isfinite(value)][0]
    raise DataError(f"{name}: example {first} (counted from 0) has a feature that is not a "
                    f"finite number ({value}), as do {np.count_nonzero(~finite)} of its "
                    f"{len(finite)} examples: replace or drop them before training (the first "
                    "step to meet one would diverge)")


def check_label_values(name: str, labels: np.ndarray, spec: InputSpec) -> None:
    """labels [N, ...]: DataError naming the first example (0-based) with a label
    outside [0, num_classes)."""
    outside = np.argwhere((labels < 0) | (labels >= spec.num_classes))
    if len(outside):
        value = labels[tuple(outside[0])]
        raise DataError(f"{name}: example {outside[0][0]} (counted from 0) has label {value}, "
                        f"outside [0, {spec.num_classes}); the labels span "
                        f"[{labels.min()}, {labels.max()}]")
