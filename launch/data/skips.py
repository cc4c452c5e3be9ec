"""Bad records: named and counted when left out, one clear error when they fail the job.

A CSV source is read whole before training, so its bad rows are known, with their
lines, before the first step. A TFRecord record is parsed (and its image decoded) in
the input pipeline; there a record that fails is found mid-run. Such a pipeline reads
record by record (``launch.data.stream.per_record``): it numbers every record, notes
where each one comes from (``RecordGaps.note``), drops those whose parsing or decoding
raises (``Dataset.ignore_errors``) and finds them again as gaps in the numbers that
reach a batch (``RecordGaps.observe``): tf.data reports nothing of what
``ignore_errors`` dropped, hence the numbering. A record found so is named (file,
record, cause) and, with ``data.on_bad_record: skip``, counted in ``SkippedRecords``;
otherwise it raises ``BadRecordError`` in the pipeline, and ``input_errors`` turns the
TensorFlow error that carries it into a ``DataError`` (exit 2) naming it.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import tensorflow as tf

from launch.data.errors import DataError, tf_error_text

# The name input_tensors gives the iterator's get_next op: an error raised there
# comes from the input pipeline, not from the model.
INPUT_OP_NAME = "input_batch"
# Skipped records named one by one in the log; after them, a line at 16, 32, 64 ...
NAMED_SKIPS = 10
# The stream number of the marker that follows a finite stream's last batch.
END_OF_STREAM = -1


def ordinal(number: int) -> str:
    """1 -> '1st', 2 -> '2nd', 3 -> '3rd', 11 -> '11th', 22 -> '22nd'."""
    suffix = {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{'th' if number % 100 in (11, 12, 13) else suffix}"


class SkippedRecords:
    """Counts and logs the records a pipeline left out; thread-safe (tf.data calls it).

    where: the data, for the counting lines. write: where log lines go. Each of the
    first NAMED_SKIPS records gets a line naming it (file, line or record, cause);
    after them a line when the count reaches 16, 32, 64 ..., so a bad file cannot
    flood the log, and the exact count is always in ``count``. on_skip(n): called with
    each new number of skipped records (e.g. a Prometheus counter's ``inc``).
    """

    def __init__(self, where: str, write: Callable[[str], None],
                 on_skip: Callable[[int], None] | None = None):
        self.where = where
        self._write = write
        self._on_skip = on_skip
        self._lock = threading.Lock()
        self.count = 0

    @property
    def names_wanted(self) -> int:
        """How many of the next skipped records are still to be named in the log."""
        return max(0, NAMED_SKIPS - self.count)

    def skipped(self, named: Sequence[str], count: int | None = None) -> None:
        """``count`` more records left out (default: one per name); ``named``: what and
        where the first of them are, e.g. "d.csv: line 7, column 'x': the cell is blank"."""
        count = len(named) if count is None else count
        if count < 1:
            return
        with self._lock:
            before = self.count
            self.count += count
            after = self.count
        for number, name in enumerate(named[:max(0, NAMED_SKIPS - before)], start=before + 1):
            self._write(f"data: skipped {name} (the {ordinal(number)} record skipped; "
                        "data.on_bad_record: skip)")
        if after > NAMED_SKIPS and (before <= NAMED_SKIPS or
                                    after.bit_length() > before.bit_length()):
            self._write(f"data: skipped {after} records of {self.where} so far, the first "
                        f"{NAMED_SKIPS} named above (data.on_bad_record: skip)")
        if self._on_skip is not None:
            self._on_skip(count)


class BadRecordError(ValueError):
    """A record failed to parse or decode mid-run under ``data.on_bad_record: fail``;
    raised inside the pipeline, its message names the record."""


class RecordGaps:
    """The records a per-record pipeline dropped, found as gaps in their stream numbers.

    name(origin): what and where the record of ``origin`` is, and why it fails
    ('FILE: record 7: ...'); the pipeline says what an origin is. skipped: where the
    records left out are counted; None fails the job on the first one instead.
    """

    def __init__(self, name: Callable[[int], str], skipped: SkippedRecords | None):
        self._name = name
        self._skipped = skipped
        self._lock = threading.Lock()
        self._origins: dict[int, int] = {}  # stream number -> origin, until it is observed
        self._next = 0
        self._last_noted = -1

    def note(self, numbers: np.ndarray, origins: np.ndarray) -> np.int64:
        """numbers, origins: int64 [B], records about to be parsed."""
        with self._lock:
            self._origins.update(zip(numbers.tolist(), origins.tolist(), strict=True))
            self._last_noted = max(self._last_noted, int(numbers.max(initial=-1)))
        return np.int64(len(numbers))

    def observe(self, numbers: np.ndarray) -> np.int64:
        """numbers: int64 [B], the stream numbers of a batch's records, in order;
        END_OF_STREAM once every record noted has been parsed or dropped."""
        dropped = []
        with self._lock:
            for number in numbers.tolist():
                if number == END_OF_STREAM:
                    number = self._last_noted + 1
                dropped += [self._origins.pop(gap) for gap in range(self._next, number)]
                self._origins.pop(number, None)
                self._next = max(self._next, number + 1)
        if dropped:
            self._dropped(dropped)
        return np.int64(len(dropped))

    def _dropped(self, origins: list[int]) -> None:
        if self._skipped is None:
            raise BadRecordError(self._name(origins[0]))
        # Naming reads the record again: only for those the log will name.
        named = [self._name(origin) for origin in origins[:self._skipped.names_wanted]]
        self._skipped.skipped(named, len(origins))

    def note_op(self, numbers: tf.Tensor, origins: tf.Tensor) -> tf.Operation:
        """An op that notes ``numbers`` and their ``origins`` (int64 [B]) when it runs."""
        return tf.numpy_function(self.note, [numbers, origins], tf.int64, stateful=True,
                                 name="note_record_origins").op

    def observe_op(self, numbers: tf.Tensor) -> tf.Operation:
        """An op that finds the gaps before ``numbers`` (int64 [B]) when it runs."""
        return tf.numpy_function(self.observe, [numbers], tf.int64, stateful=True,
                                 name="find_dropped_records").op


@contextmanager
def input_errors(where: str) -> Iterator[None]:
    """Raise a DataError (one line) for an error of the input pipeline met mid-run:
    a record that does not parse or decode (named, when the pipeline could name it),
    a label out of range, a corrupt file."""
    try:
        yield
    except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as err:
        if not _from_input(err):
            raise
        named = re.search(rf"{BadRecordError.__name__}: ([^\n]+)", err.message)
        if named:
            raise DataError(f"{named.group(1)} (data.on_bad_record: skip leaves such "
                            "records out)") from None
        raise DataError(f"{where}: a record failed mid-run: {tf_error_text(err.message)} "
                        "(data.on_bad_record: skip leaves such records out)") from None


def _from_input(err: tf.errors.OpError) -> bool:
    """Whether the error was raised by the input iterator's get_next (named in the
    message's [[...]] trace when the session does not give the op)."""
    op = getattr(err, "op", None)
    if op is not None and op.name.split("/")[-1] == INPUT_OP_NAME:
        return True
    return any(mark in err.message for mark in (
        f"[[{INPUT_OP_NAME}]]", f"{{{{node {INPUT_OP_NAME}}}}}"))
