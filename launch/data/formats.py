"""Files: the paths and globs of a source resolved, and named in messages. Each format's
files are read by its source (``launch.data.sources``)."""

from __future__ import annotations

import os
from collections.abc import Sequence

import tensorflow as tf

from launch.data.errors import DataError
from launch.data.index_file import is_index_file

PathArg = str | os.PathLike | Sequence[str | os.PathLike] | None


def _has_magic(pattern: str) -> bool:
    return any(char in pattern for char in "*?[")


def resolve_files(path: PathArg, source: str) -> list[str]:
    """A file, a glob or a sequence of them -> the list of files (globs sorted, the
    record indexes kept beside TFRecord files left out).

    Raises DataError for no path, a missing file, a directory or a glob matching nothing.
    """
    if path is None:
        raise DataError(f"the {source} source needs a path (a file, a glob or a list of them)")
    if not isinstance(path, str | os.PathLike):
        files = [name for item in path for name in resolve_files(item, source)]
        if not files:
            raise DataError(f"the {source} source got an empty list of files")
        return files
    pattern = os.fspath(path)
    if _has_magic(pattern):
        try:
            files = sorted(name for name in tf.io.gfile.glob(pattern)
                           if not is_index_file(name))
        except tf.errors.OpError as err:
            raise DataError(f"{pattern}: cannot list the glob: {err.message}") from None
        if not files:
            raise DataError(f"{pattern}: the glob matches no files")
        return files
    if not tf.io.gfile.exists(pattern):
        raise DataError(f"{pattern}: no such file")
    if tf.io.gfile.isdir(pattern):
        raise DataError(f"{pattern}: is a directory; pass a file or a glob such as "
                        f"{os.path.join(pattern, '*')}")
    return [pattern]


def single_file(path: PathArg, source: str) -> str:
    files = resolve_files(path, source)
    if len(files) != 1:
        raise DataError(f"{describe(path, files)}: the {source} source reads one file, "
                        f"got {len(files)}")
    return files[0]


def describe(path: PathArg, files: list[str]) -> str:
    """The path as the user gave it, for messages."""
    if isinstance(path, str | os.PathLike):
        return os.fspath(path)
    if path is not None and len(path) == 1:
        return os.fspath(path[0])
    if len(files) > 3:
        return f"{files[0]}, ..., {files[-1]} ({len(files)} files)"
    return ", ".join(files) if files else repr(path)


def read_error(name: str, err: Exception) -> DataError:
    detail = err.message if isinstance(err, tf.errors.OpError) else str(err)
    return DataError(f"{name}: cannot read: {detail}")


def file_size(name: str) -> int:
    """The size of file ``name`` in bytes; DataError when it cannot be read."""
    try:
        return tf.io.gfile.stat(name).length
    except tf.errors.OpError as err:
        raise read_error(name, err) from None
