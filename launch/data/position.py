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
        return self.base_step + batches_left(self.base_position, epochs, self.num_examples,
                                             self.batch_size)

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


def batches_left(start: int, epochs: int, num_examples: int, global_batch: int) -> int:
    """The whole global batches of ``global_batch`` from position ``start`` to the end
    of ``epochs`` passes over ``num_examples`` examples (a last, partial one is not
    trained)."""
    return max(epochs * num_examples - start, 0) // global_batch


# Asynchronous ps/worker. Each worker trains its part (BatchPart) of the global batches
# at its own pace, so no one position says where the data stands: each worker has its
# own, the position of the first example of the next global batch whose part it has not
# trained ("worker positions"). Every worker's moves by the global batch B at each of its
# steps, and all are set together (below), so they differ by whole global batches.


def resumed_positions(saved: list[int] | None, position: int, workers: int) -> list[int]:
    """The worker positions a job of ``workers`` asynchronous workers goes on from, given
    those a checkpoint ``saved`` (None: a checkpoint of another arrangement, whose data
    stood at ``position``). The same number of workers: each its own. Another: every
    worker at the lowest, so the parts the others had trained beyond it are trained
    again (a global batch's parts are other slices for another number of workers)."""
    if saved is None:
        return [position] * workers
    if len(saved) == workers:
        return list(saved)
    return [min(saved)] * workers


def positions_trained(positions: list[int], parts: list[int], global_batch: int) -> int:
    """The examples the job's steps have taken when its asynchronous workers stand at
    ``positions``, worker i taking ``parts[i]`` examples of every global batch: the
    whole global batches before the lowest position, and each worker's parts beyond it
    (the count a synchronous job's position gives when all stand together)."""
    low = min(positions)
    return low + sum(size * ((p - low) // global_batch) for p, size in zip(positions, parts,
                                                                             strict=True))
