"""Where the training data stands: which positions of the data each global step trains,
which of them a process takes, and the step at which the data's passes end.

The examples of the data's epochs, laid end to end, are numbered 0, 1, 2, ...: their
positions (epoch e holds positions [e * N, (e + 1) * N) of N examples, in the order
``launch.data.order`` gives it). Global step s trains positions [p(s), p(s) + B) with

    p(s) = base_position + (s - base_step) * B

(B, train.batch_size), so a job resumed at any step, on any number of processes and
towers, knows where its data stands from the step alone; the base moves only when a
resumed job changes B or its data (``DataProgress.rebased``). The checkpoint keeps it
(``launch.runtime.data_state``). Pure arithmetic: no TensorFlow graph.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import towers


@dataclass(frozen=True)
class BatchPart:
    """A process's examples of every global batch of ``global_batch``: the ``size`` from
    ``offset`` on. Process i of n takes towers.shard_sizes(B, n)[i], the towers' own
    split, so n processes of T towers train each step's examples as one device would."""

    global_batch: int
    offset: int = 0
    size: int = 0

    @classmethod
    def of(cls, global_batch: int, index: int = 0, count: int = 1) -> BatchPart:
        sizes = towers.shard_sizes(global_batch, count)
        return cls(global_batch, sum(sizes[:index]), sizes[index])


@dataclass(frozen=True)
class DataProgress:
    """Where a job's data stands: base_position is the position of step base_step's
    first example, and every step since has taken batch_size examples of data of
    num_examples examples an epoch."""

    base_step: int
    base_position: int
    batch_size: int
    num_examples: int

    def position(self, step: int) -> int:
        """The position of global step ``step``'s first example."""
        return self.base_position + (step - self.base_step) * self.batch_size

    def end_step(self, epochs: int | None) -> int | None:
        """The global step at which ``epochs`` passes over the data end: the last step
        whose whole batch lies within them is the one before (a last, partial batch of
        fewer than batch_size examples is not trained). None: the data has no end."""
        if epochs is None:
            return None
        left = epochs * self.num_examples - self.base_position
        return self.base_step + left // self.batch_size if left >= 0 else self.base_step

    def epoch(self, step: int) -> float:
        """The passes over the data done before step ``step`` (1.5: half way through the
        second)."""
        return self.position(step) / self.num_examples

    def where(self, step: int, epochs: int | None) -> str:
        """'epoch 1 of 2, example 7,900 of 17,970': where step ``step`` starts."""
        epoch, example = divmod(self.position(step), self.num_examples)
        of = f" of {epochs}" if epochs is not None else ""
        return f"epoch {epoch + 1:,}{of}, example {example:,} of {self.num_examples:,}"

    def at(self, step: int, batch_size: int) -> DataProgress:
        """The same data read from step ``step`` on in batches of ``batch_size``: the next
        example stays the next (a resumed job that changed train.batch_size)."""
        return dataclasses.replace(self, base_step=step, base_position=self.position(step),
                                   batch_size=batch_size)

    def next_epoch(self, step: int, batch_size: int, num_examples: int) -> DataProgress:
        """Other data from step ``step`` on: the epoch under way counts as done, and the
        new data starts at the next epoch's first example."""
        done = -(-self.position(step) // self.num_examples)
        return DataProgress(step, done * num_examples, batch_size, num_examples)
