"""The order of a TFRecord source's records in each epoch, and where to read from to
start at any position of it.

Epoch e (of N records in all):

1. the files in a permutation drawn from (data.seed, e);
2. taken GROUP_FILES at a time, each group's files read round robin, a record from each
   in turn (a file that ends drops out), as tf.data's interleave reads them;
3. each group's stream cut into windows of ``data.shuffle_buffer`` records (the last
   window of a group shorter), each window permuted by (data.seed, e, group, window).

So a record moves at most a window from its place in the round robin, like a
shuffle buffer of that size, and every epoch's order is a function of (data.seed, e)
alone: the same on every resume and for any number of readers. ``shuffle_buffer: 0``
reads the files in their order, one after another, each in its own order.

A reader starting at position p begins at the start of p's window (a group's files
opened at the records the round robin has reached there, by the record index), permutes
that window and skips the records before p: at most a window is read to no purpose.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from launch.data.order import permutation
from launch.data.record_index import RecordIndex

GROUP_FILES = 16  # files read round robin together: enough to mix shards
_FILES = 1  # the salt of an epoch's file permutation


@dataclass(frozen=True)
class GroupPlan:
    """Where a reader starts in one group of files.

    files, records, offsets: int64 [k], the group's files with records left, in the
    order the round robin continues, and in each the first record to read and its
    byte offset. first_position: the position of the first record read, the start of
    the window ``window`` (counted in its group). skip: the records of that window
    before the position the reader wants. key: the group's own number across epochs
    (epoch * groups + group), seeding its windows' permutations.
    """

    files: np.ndarray
    records: np.ndarray
    offsets: np.ndarray
    first_position: int
    window: int
    skip: int
    key: int

    def as_tuple(self) -> tuple:
        return (self.files, self.records, self.offsets, self.first_position, self.window,
                self.skip, self.key)


class RecordOrder:
    """Epochs of a source's records, in groups of files and windows (module docstring)."""

    def __init__(self, index: RecordIndex, seed: int, window: int):
        self.index = index
        self.seed = seed
        self.shuffle = window > 0
        self.window = window if self.shuffle else 1
        self.counts = index.counts
        self.total = int(self.counts.sum())
        self.group_files = GROUP_FILES if self.shuffle else 1
        self.num_groups = -(-len(self.counts) // self.group_files)

    def groups(self, epoch: int) -> list[np.ndarray]:
        """Epoch ``epoch``'s groups of file indices, in reading order."""
        files = len(self.counts)
        order = (permutation(self.seed, epoch, files, _FILES) if self.shuffle
                 else np.arange(files, dtype=np.int64))
        return [order[i:i + self.group_files] for i in range(0, files, self.group_files)]

    def plans(self, start: int) -> Iterator[GroupPlan]:
        """Every group a reader reads from position ``start`` on, epoch after epoch."""
        epoch, wanted = divmod(int(start), self.total)
        while True:
            first = 0
            for number, files in enumerate(self.groups(epoch)):
                size = int(self.counts[files].sum())
                if first + size > wanted:
                    yield self._plan(files, epoch, number, first, max(wanted - first, 0))
                first += size
            epoch, wanted = epoch + 1, 0

    def _plan(self, files: np.ndarray, epoch: int, number: int, first: int,
              wanted: int) -> GroupPlan:
        """The plan of group ``number`` (its first position ``first`` in the epoch) for a
        reader wanting its ``wanted``-th record on."""
        window = wanted // self.window
        begin = window * self.window
        taken, order = round_robin(self.counts[files], begin)
        records = taken[order]
        offsets = np.array([self.index.offset(int(files[i]), int(taken[i])) for i in order],
                           np.int64)
        return GroupPlan(files[order], records, offsets,
                         epoch * self.total + first + begin, window, wanted - begin,
                         epoch * self.num_groups + number)


def round_robin(counts: np.ndarray, taken: int) -> tuple[np.ndarray, np.ndarray]:
    """Files of ``counts`` records read round robin in order (a file that ends drops
    out), after ``taken`` records: the records read of each, int64 [k], and the files
    with records left, in the order the round robin goes on from there."""
    counts = np.asarray(counts, np.int64)
    rounds = _full_rounds(counts, taken)
    read = np.minimum(counts, rounds)
    left = taken - int(read.sum())
    active = np.flatnonzero(counts > rounds)
    read[active[:left]] += 1
    order = [i for i in (*active[left:], *active[:left]) if read[i] < counts[i]]
    return read, np.array(order, np.int64)


def _full_rounds(counts: np.ndarray, taken: int) -> int:
    """The most whole rounds r with sum(min(counts, r)) <= taken (binary search)."""
    low, high = 0, int(counts.max(initial=0))
    while low < high:
        middle = (low + high + 1) // 2
        if int(np.minimum(counts, middle).sum()) <= taken:
            low = middle
        else:
            high = middle - 1
    return low
