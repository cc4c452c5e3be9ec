"""CSV sources: every row of every file read and checked before training, then held in
memory.

The rules (docs/data.md, "Your data"):

* line 1 is a header naming the columns; every file of a source has the same header.
* the label column (``data.label_column``) holds class ids: whole numbers (``2`` or
  ``2.0``) in [0, num_classes). Names of classes are refused: a mapping from names to
  ids would have to travel with every checkpoint to evaluation, export and serving.
* the feature columns (``data.feature_columns`` in that order; by default every named
  column but the label, in file order: a column with an empty name, such as the index
  pandas writes, is not read) hold finite numbers as Python's ``float`` reads them
  (``1``, ``-2.5``, ``1e-3``; ``nan`` and ``inf`` are bad cells); integer models need
  whole numbers.
  Columns that are neither are not read, so they may hold anything.
* blank lines are skipped; every other line has as many fields as the header.

A bad row is named by its file, its line (the header is line 1), the column and the
cause. Reading the whole source up front finds a bad row wherever it is before anything
is written, and gives the row count and the class count; the price is memory, so a
source is read up to MAX_CSV_BYTES of files (more data: TFRecord files).
"""

from __future__ import annotations

import csv
import functools
import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from launch.data.errors import DataError
from launch.data.formats import describe, read_error
from models import InputSpec

MAX_CSV_BYTES = 1 << 30  # 1 GiB: about 35 s to read on one core, and its numbers in memory
KEPT_BAD_ROWS = 10  # bad rows named (of each file, in a table); the rest are counted
_CHUNK_ROWS = 1 << 16  # rows parsed into Python floats before they become one array


@dataclass(frozen=True)
class BadRow:
    """One row that cannot be an example: where it is and why."""

    file: str
    line: int
    cause: str
    column: str | None = None

    def __str__(self) -> str:
        where = f"{self.file}: line {self.line}"
        return f"{where}, column {self.column!r}: {self.cause}" if self.column else (
            f"{where}: {self.cause}")


@dataclass(frozen=True)
class CsvTable:
    """The good rows of a CSV source, and its bad ones.

    features: float64 [N, len(feature_columns)]; labels: int64 [N]; file_of: int32 [N],
    each row's index in ``files``; lines: int64 [N], each row's line in its file.
    bad: the first KEPT_BAD_ROWS rows of each file that do not parse, in file order;
    bad_counts: how many each file has.
    """

    files: tuple[str, ...]
    feature_columns: tuple[str, ...]
    label_column: str
    features: np.ndarray
    labels: np.ndarray
    file_of: np.ndarray
    lines: np.ndarray
    bad: tuple[BadRow, ...]
    bad_counts: tuple[int, ...]

    def where(self, row: int) -> tuple[str, int]:
        """(file, line) of the good row ``row``."""
        return self.files[self.file_of[row]], int(self.lines[row])


def read_csv(files: Sequence[str], label_column: str,
             feature_columns: Sequence[str] | None) -> CsvTable:
    """Every row of ``files``; raises DataError for an unreadable file, a bad header or
    a source over MAX_CSV_BYTES. Bad rows are kept in the table, not raised: whether
    they fail the job is the caller's to decide. Read once per process while the files
    stay the same (size and modification time)."""
    stamps = tuple(_stamp(name) for name in files)
    total = sum(size for size, _ in stamps)
    if total > MAX_CSV_BYTES:
        raise DataError(f"{describe(list(files), list(files))}: {total / (1 << 30):.1f} GiB of "
                        f"CSV; a CSV source is read whole into memory, up to "
                        f"{MAX_CSV_BYTES >> 30} GiB: write larger data as TFRecord files")
    columns = tuple(feature_columns) if feature_columns is not None else None
    return _read_cached(tuple(files), label_column, columns, stamps)


def _stamp(name: str) -> tuple[int, int]:
    try:
        stat = tf.io.gfile.stat(name)
    except tf.errors.OpError as err:
        raise read_error(name, err) from None
    return stat.length, stat.mtime_nsec


@functools.lru_cache(maxsize=4)
def _read_cached(files: tuple[str, ...], label_column: str,
                 feature_columns: tuple[str, ...] | None,
                 stamps: tuple[tuple[int, int], ...]) -> CsvTable:
    del stamps  # part of the cache key only: a file that changed is read again
    header = _header(files[0], label_column, feature_columns)
    names = [name.strip() for name in header]
    features = feature_columns or tuple(n for n in names if n not in (label_column, ""))
    used = [names.index(name) for name in (*features, label_column)]
    parts, bad, bad_counts = [], [], []
    for index, name in enumerate(files):
        values, lines, file_bad, count = _read_rows(name, header, names, used)
        parts.append((values, lines, np.full(len(lines), index, np.int32)))
        bad += file_bad
        bad_counts.append(count)
    values = np.concatenate([part[0] for part in parts])
    return CsvTable(files, tuple(features), label_column, values[:, :-1],
                    values[:, -1].astype(np.int64), np.concatenate([p[2] for p in parts]),
                    np.concatenate([p[1] for p in parts]), tuple(bad), tuple(bad_counts))


# ---------------------------------------------------------------------------- header


def _rows(name: str) -> Iterator[tuple[int, list[str]]]:
    """(line, fields) of each row of a CSV file, header first (read lazily); the line is
    where the row ends, so a quoted field spanning lines does not shift the next."""
    try:
        with tf.io.gfile.GFile(name, "rb") as raw:
            # GFile's own text mode reads at half the speed; "utf-8-sig" drops the
            # byte-order mark some editors write.
            buffered = io.BufferedReader(_RawFile(raw), 1 << 20)
            reader = csv.reader(io.TextIOWrapper(buffered, "utf-8-sig", newline=""))
            for row in reader:
                yield reader.line_num, row
    except (OSError, UnicodeDecodeError, csv.Error, tf.errors.OpError) as err:
        raise read_error(name, err) from None


class _RawFile(io.RawIOBase):
    """A GFile (local or remote) as the raw stream Python's buffered text reading takes."""

    def __init__(self, gfile: tf.io.gfile.GFile) -> None:
        super().__init__()
        self._gfile = gfile

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:
        data = self._gfile.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


def _header(name: str, label_column: str, feature_columns: Sequence[str] | None) -> list[str]:
    """The first file's header, checked: the label and feature columns are in it once."""
    rows = _rows(name)
    first = next(rows, None)
    rows.close()
    if first is None:
        raise DataError(f"{name}: empty file, expected a CSV header row naming the columns")
    header = first[1]
    names = [column.strip() for column in header]
    for column in filter(None, names):
        if names.count(column) > 1:
            raise DataError(f"{name}: the CSV header names the column {column!r} twice")
    wanted = [label_column, *(feature_columns or ())]
    missing = [column for column in wanted if column not in names]
    if missing:
        kind = "label column" if missing[0] == label_column else "feature column"
        raise DataError(f"{name}: the CSV header has no {kind} {missing[0]!r} "
                        f"(data.{kind.replace(' ', '_')}{'s' if kind[0] == 'f' else ''}); "
                        f"it has: {_listed(names)}{_looks_like_data(names)}")
    return header


def _listed(names: list[str]) -> str:
    return ", ".join(names[:12]) + (f", ... ({len(names)} columns)" if len(names) > 12 else "")


def _looks_like_data(names: list[str]) -> str:
    try:
        float(names[0])
    except ValueError:
        return ""
    return " (line 1 looks like data: the first line must be a header naming the columns)"


# ------------------------------------------------------------------------------ rows


def _read_rows(name: str, header: list[str], names: list[str], used: list[int]
               ) -> tuple[np.ndarray, np.ndarray, list[BadRow], int]:
    """values float64 [n, len(used)] and lines int64 [n] of a file's good rows (the
    label last), the first KEPT_BAD_ROWS bad rows and the count of bad ones."""
    chunks, chunk, lines, line_chunks, bad, bad_count = [], [], [], [], [], 0
    rows = _rows(name)
    if next(rows, (1, []))[1] != header:
        rows.close()
        raise DataError(f"{name}: its CSV header differs from the first file's")
    for line, row in rows:
        # The common case first, in as few Python steps as possible: it runs per row.
        try:
            values = [float(row[index]) for index in used] if len(row) == len(names) else None
        except ValueError:
            values = None
        if values is not None and values[-1].is_integer():
            chunk.append(values)
            lines.append(line)
            if len(chunk) == _CHUNK_ROWS:
                chunks.append(np.array(chunk, np.float64))
                line_chunks.append(np.array(lines, np.int64))
                chunk, lines = [], []
        elif row and (len(row) > 1 or row[0].strip()):  # not a blank line
            bad_count += 1
            if len(bad) < KEPT_BAD_ROWS:
                bad.append(BadRow(name, line, *_row_problem(row, names, used)))
    chunks.append(np.array(chunk, np.float64).reshape(-1, len(used)))
    line_chunks.append(np.array(lines, np.int64))
    return np.concatenate(chunks), np.concatenate(line_chunks), bad, bad_count


def _row_problem(row: list[str], names: list[str], used: list[int]) -> tuple[str, str | None]:
    """(cause, column) of why a row is not an example."""
    if len(row) != len(names):
        return f"{len(row)} fields, the header has {len(names)} columns", None
    for index in used:
        cell = row[index].strip()
        try:
            float(cell)
        except ValueError:
            return _not_a_number(cell, index == used[-1]), names[index]
    return (f"{row[used[-1]].strip()!r} is not a class id (labels are whole numbers "
            "from 0)"), names[used[-1]]


# The fix for a label that is a class's name, in the cause: skipping such rows is none.
NUMBER_THE_CLASSES = "number the classes before training; names are not mapped"


def _not_a_number(cell: str, label: bool) -> str:
    if not cell:
        return "the cell is blank"
    if label:
        return (f"{cell!r} is not a class id: labels are whole numbers from 0 "
                f"({NUMBER_THE_CLASSES})")
    return f"{cell!r} is not a number"


# ----------------------------------------------------------------- against a spec


def check_against_spec(table: CsvTable, spec: InputSpec, where: str, chosen: bool) -> None:
    """The table's columns against ``spec``: one label per row, the feature count.
    chosen: whether data.feature_columns named the features."""
    if spec.label_shape != ():
        raise DataError(f"{where}: a CSV row holds one label, the model takes labels of "
                        f"shape {list(spec.label_shape)}")
    count = len(table.feature_columns)
    if count != spec.num_features:
        which = "data.feature_columns" if chosen else (
            f"every named column but {table.label_column!r}")
        raise DataError(f"{where}: {count} feature columns ({which}), the model takes "
                        f"{spec.num_features} (features {list(spec.feature_shape)})")


def rows_against_spec(table: CsvTable, spec: InputSpec) -> tuple[np.ndarray, list[BadRow], int]:
    """Which good rows ``spec`` can take: keep bool [N]; the first KEPT_BAD_ROWS it
    cannot (a label outside [0, num_classes); a feature that is not finite, NaN or
    infinite, which would make the first step holding it diverge; a fraction for
    integer features) and how many it cannot."""
    outside = (table.labels < 0) | (table.labels >= spec.num_classes)
    bad = [BadRow(*table.where(row), f"label {table.labels[row]} is outside "
                  f"[0, {spec.num_classes})", table.label_column)
           for row in np.flatnonzero(outside)[:KEPT_BAD_ROWS]]
    finite = np.isfinite(table.features)
    nonfinite = ~finite.all(axis=1) & ~outside
    for row in np.flatnonzero(nonfinite)[:KEPT_BAD_ROWS]:
        column = int(np.argmin(finite[row]))
        bad.append(BadRow(*table.where(row), f"{table.features[row, column]} is not a finite "
                          "number", table.feature_columns[column]))
    fractions = np.zeros_like(outside)
    if spec.int_features:
        fractions = (np.any(table.features != np.round(table.features), axis=1)
                     & ~(outside | nonfinite))
        for row in np.flatnonzero(fractions)[:KEPT_BAD_ROWS]:
            column = int(np.argmax(table.features[row] != np.round(table.features[row])))
            value = np.format_float_positional(table.features[row, column], trim="-")
            bad.append(BadRow(*table.where(row), f"{value} is not a whole number (the model "
                              f"takes {spec.feature_dtype.name} features)",
                              table.feature_columns[column]))
    keep = ~(outside | nonfinite | fractions)
    return keep, bad, int(np.count_nonzero(~keep))


# ------------------------------------------------------------------- what jobs read


@dataclass(frozen=True)
class CsvExamples:
    """What a reader takes from a CSV source: features float64 [N, F] and labels int64
    [N]; the rows left out, the first KEPT_BAD_ROWS of them (in file order), and how
    many there are."""

    features: np.ndarray
    labels: np.ndarray
    bad: tuple[BadRow, ...]
    bad_count: int


def csv_examples(files: Sequence[str], spec: InputSpec, label_column: str,
                 feature_columns: Sequence[str] | None, *, skip: bool) -> CsvExamples:
    """The examples of ``files`` as ``spec`` takes them. A bad row is a DataError naming
    it, unless ``skip``; a source without examples is one either way."""
    where = describe(list(files), list(files))
    table = read_csv(files, label_column, feature_columns)
    check_against_spec(table, spec, where, feature_columns is not None)
    keep, spec_bad, _ = rows_against_spec(table, spec)
    order = {name: index for index, name in enumerate(files)}
    bad = sorted((*table.bad, *spec_bad),
                 key=lambda row: (order[row.file], row.line))[:KEPT_BAD_ROWS]
    count = sum(table.bad_counts) + int(np.count_nonzero(~keep))
    if bad and not skip:
        raise bad_row_error(table, bad[0], count)
    if not keep.any():
        raise no_examples(where, bad, count)
    return CsvExamples(table.features[keep], table.labels[keep], tuple(bad), count)


def no_examples(where: str, bad: Sequence[BadRow], count: int) -> DataError:
    """The error of a source whose rows are all bad (``count``, the first ``bad``), or
    that has none."""
    found = f"all {count} rows are bad, e.g. {bad[0]}" if count else (
        "a header row and no data rows")
    return DataError(f"{where}: no examples: {found}")


def bad_row_error(table: CsvTable, first: BadRow, count: int) -> DataError:
    """The error of a source with ``count`` bad rows, ``first`` the first of them, with
    the hint that fits its cause. Skipping bad rows (data.on_bad_record: skip) is offered
    only where it leaves data and fixes something: never when no row is good, nor for
    labels that are classes' names, which are to be numbered. When no row is good, the
    likeliest cause is a column that is not a feature at all."""
    none_good = not len(table.labels)
    if none_good and first.column not in (None, table.label_column):
        return DataError(f"{first} (and every other row; if {first.column!r} is not a "
                         "feature, leave it out: data.feature_columns names the features)")
    if none_good:
        return DataError(f"{first} (and every other row)")
    rows = "1 bad row" if count == 1 else f"{count} bad rows"
    if NUMBER_THE_CLASSES in first.cause:
        return DataError(f"{first} ({rows})")
    return DataError(f"{first} ({rows}; data.on_bad_record: skip leaves bad rows out)")


def label_classes(table: CsvTable) -> tuple[int, str] | None:
    """The class count the good rows' labels imply, the largest plus one, and where the
    largest is, for messages; None without rows."""
    if not len(table.labels):
        return None
    row = int(np.argmax(table.labels))
    name, line = table.where(row)
    return int(table.labels[row]) + 1, f"{name} line {line}"
