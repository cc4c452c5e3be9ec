"""The data position as training state: variables saved with the model, and the hook that
starts each session's input where they say.

What a checkpoint keeps of the data (``towers_data/*``, int64 scalars beside the global
step): the base of launch.data.position.DataProgress (base_step, base_position,
batch_size, num_examples) and what the data was (data.seed, a hash of its files and
their sizes). A session starts its input at the position of the global step it starts
at, so a resume, on any number of towers, workers or ranks, continues at the next
example (an asynchronous ps/worker job's workers each at their own position instead:
launch.runtime.worker_positions). A resumed job whose train.batch_size changed
continues at the same example; one whose data changed (files, their number of
examples, data.seed) counts the epoch under way as done and starts the next, and says
so. The process that owns its copy of the variables (``rebases``: the chief, each
collective worker, each Horovod rank, each with the same values) writes the new base
before its first step; a ps/worker worker that is not the chief waits until the chief
has.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import tensorflow as tf

import towers
from launch.data.position import DataProgress, batches_left, positions_trained
from launch.errors import BadInput, PeerUnavailable
from launch.runtime.checkpoints import DATA_SCOPE
from launch.runtime.hooks import LastStep
from launch.runtime.inputs import TrainingInput
from launch.runtime.worker_positions import WorkerPositions

V1 = tf.compat.v1

FIELDS = ("base_step", "base_position", "batch_size", "num_examples", "seed", "files")
SCOPE = DATA_SCOPE
WAIT_POLL_SECS = 0.5


@dataclass(frozen=True)
class Stored:
    """The data state's values: the progress, and which data it counts."""

    progress: DataProgress
    seed: int
    files: int

    @classmethod
    def of(cls, values: dict[str, int]) -> Stored:
        progress = DataProgress(*(int(values[f]) for f in FIELDS[:4]))
        return cls(progress, int(values["seed"]), int(values["files"]))

    def as_dict(self) -> dict[str, int]:
        p = self.progress
        return dict(zip(FIELDS, (p.base_step, p.base_position, p.batch_size, p.num_examples,
                                 self.seed, self.files), strict=True))


def files_hash(identity: str) -> int:
    """A signed 64-bit hash of the data's identity (its files and sizes)."""
    return int.from_bytes(hashlib.blake2b(identity.encode(), digest_size=8).digest(), "little",
                          signed=True)


class DataState:
    """The ``towers_data/*`` variables of a job whose steps each take ``batch_size``
    examples of the data ``data`` feeds; made in the default graph, on ``device`` (the
    global step's)."""

    def __init__(self, data: TrainingInput, batch_size: int, seed: int,
                 device: str | Callable):
        self.wanted = Stored(DataProgress(0, 0, batch_size, data.num_examples), seed,
                             files_hash(data.identity))
        initial = self.wanted.as_dict()
        with V1.device(device), V1.variable_scope(SCOPE):
            self.variables = {name: V1.get_variable(name, initializer=tf.constant(
                initial[name], tf.int64), trainable=False, use_resource=True)
                for name in FIELDS}
        self._fed = {name: V1.placeholder(tf.int64, [], name=f"{SCOPE}_{name}")
                     for name in FIELDS}
        self._write = tf.group(*[v.assign(self._fed[n]) for n, v in self.variables.items()])

    def read(self, session) -> Stored:
        return Stored.of(session.run(self.variables))

    def read_at(self, session, global_step: tf.Tensor) -> tuple[int, Stored]:
        """The global step and the state, in one run (each run of a new set of fetches
        costs a start its graph's optimisation)."""
        step, values = session.run((global_step, self.variables))
        return int(step), Stored.of(values)

    def write(self, session, stored: Stored) -> None:
        session.run(self._write, {self._fed[n]: v for n, v in stored.as_dict().items()})


def reconcile(stored: Stored, wanted: Stored, step: int) -> tuple[Stored, str | None]:
    """The state a job with ``wanted``'s batch size and data goes on with from ``step``,
    given what the checkpoint ``stored``; and what changed, said for the log (None)."""
    old, new = stored.progress, wanted.progress
    if (stored.seed, stored.files, old.num_examples) != (wanted.seed, wanted.files,
                                                          new.num_examples):
        moved = old.next_epoch(step, new.batch_size, new.num_examples)
        return Stored(moved, wanted.seed, wanted.files), (
            f"the data differ from the checkpoint's ({_data_change(stored, wanted)}): "
            f"epoch {moved.base_position // new.num_examples} counts as done, and "
            f"training goes on at the start of epoch {moved.base_position // new.num_examples + 1}")
    if old.batch_size != new.batch_size:
        moved = old.at(step, new.batch_size)
        return Stored(moved, stored.seed, stored.files), (
            f"train.batch_size is {new.batch_size}, the checkpoint's {old.batch_size}: "
            f"training goes on at the next example, {moved.where(step, None)}")
    return stored, None


def _data_change(stored: Stored, wanted: Stored) -> str:
    changes = []
    if stored.seed != wanted.seed:
        changes.append(f"data.seed {stored.seed} -> {wanted.seed}")
    if stored.progress.num_examples != wanted.progress.num_examples:
        changes.append(f"{stored.progress.num_examples:,} -> "
                       f"{wanted.progress.num_examples:,} examples")
    elif stored.files != wanted.files:
        changes.append("other files")
    return ", ".join(changes)


class DataPositionHook(V1.train.SessionRunHook):
    """As each session starts: settle the data state (reconcile), start the input at the
    global step's position, and set where the data's passes end.

    rebases: this process writes the state when it must change (else it waits, at most
    wait_secs, for the process that does). announce: this process says what changed.
    resumed_from: the checkpoint a writer resumed from, named in the line saying where
    the data stands. positions: an asynchronous ps/worker job's worker positions (None in
    any other job): the data stands at the lowest, and this worker's input starts at its
    own.
    """

    def __init__(self, state: DataState, data: TrainingInput, global_step: tf.Tensor,
                 epochs: int | None, last: LastStep, *, rebases: bool, announce: bool,
                 wait_secs: float, resumed_from: str | None, write: Callable[[str], None],
                 positions: WorkerPositions | None = None):
        self._state, self._data, self._global_step = state, data, global_step
        self._positions = positions
        self._latest: list[int] | None = None  # the worker positions, as last read
        self._next = self._steps = 0  # this worker's position, and its steps this session
        self._input_step = 0  # the global step whose batch the input gives next
        self._epochs, self._last = epochs, last
        self._rebases, self._announce, self._wait_secs = rebases, announce, wait_secs
        self._resumed_from, self._write = resumed_from, write
        self.progress: DataProgress | None = None
        self.batches: int | None = None  # this session's input's, None: no end

    def after_create_session(self, session, coord) -> None:
        step, first_read = self._state.read_at(session, self._global_step)
        stored = self._settled(session, step, first_read)
        self.progress = progress = stored.progress
        end = progress.end_step(self._epochs)
        start = progress.position(step)
        if self._positions is not None:
            self._latest = self._positions.read(session)
            start = self._next = self._latest[self._positions.rank]
            self._steps = 0
        self.batches = batches = self._batches_from(start)
        self._input_step, self._steps = step, 0
        if self._positions is None:
            self._last.data_end = end
        else:  # a worker ends with its own input (the global step says nothing of it)
            self._last.data_end = step if batches == 0 else None
        self._data.begin(session, start, batches)
        if self._resumed_from is not None:
            self._write(f"resuming from {self._resumed_from} at step {step}: "
                        f"{progress.where(step, self._epochs)}{self._workers_text()}")
            self._resumed_from = None  # a session made again (a lost ps) says nothing

    def _workers_text(self) -> str:
        """Where an asynchronous job's workers stand, said after where its data stands."""
        if self._positions is None:
            return ""
        at = ", ".join(f"{p:,}" for p in self._latest)
        restored = self._positions.restored
        if restored is None:
            return f"; worker positions {at}: each worker goes on at its own next part"
        batch = self.progress.batch_size
        again = positions_trained(restored, towers.shard_sizes(batch, len(restored)),
                                  batch) - min(restored)
        return (f"; the checkpoint's {len(restored)} workers stood at positions "
                f"{', '.join(f'{p:,}' for p in restored)}: each of the "
                f"{self._positions.workers} starts at the lowest, and the {again:,} examples "
                "trained beyond it are trained again")

    def before_run(self, run_context):
        if self._positions is not None:
            return V1.train.SessionRunArgs(self._positions.after_step)
        return None

    def follow(self, session, step: int) -> None:
        """This process's next step is global step `step` (a synchronous worker that fell
        behind skips the steps that went ahead without it): its input goes on at that
        step's batch, not at the next of its own."""
        if self._positions is not None or step == self._input_step:
            return
        position = self.progress.position(step)
        left = self._batches_from(position)
        self.batches = None if left is None else self._steps + left
        self._data.begin(session, position, left)
        self._input_step = step

    def after_run(self, run_context, run_values) -> None:
        if self._positions is None:
            self._steps += 1
            self._input_step += 1
            return
        self._latest = [int(p) for p in run_values.results]
        self._steps += 1
        self._next += self.progress.batch_size
        mine = self._latest[self._positions.rank]
        if mine != self._next:
            self._moved_under(run_context.session, mine)

    def _moved_under(self, session, mine: int) -> None:
        """This worker's position is not where its steps left it: a chief restarted alone
        restored a checkpoint onto the ps. Go on at the restored position; this step's
        advance may have landed on it, so one global batch before it (a part trained
        twice rather than one skipped)."""
        at = max(mine - self.progress.batch_size, 0)
        self._positions.put_back(session, at)
        left = self._batches_from(at)
        self.batches = None if left is None else self._steps + left
        self._data.begin(session, at, left)
        self._next = at
        self._write(f"this worker's position moved to {mine:,} (a checkpoint restored under "
                    f"it): it goes on at {at:,}")

    def end(self, session) -> None:
        if self._positions is not None:
            self._latest = self._positions.read(session)

    def parts_left(self, positions: list[int]) -> list[int]:
        """The parts of the data's passes each asynchronous worker has left to train."""
        return [self._batches_from(p) or 0 for p in positions]

    def _batches_from(self, position: int) -> int | None:
        """The whole global batches from ``position`` to the end of the data's passes;
        None when the data has no end (no data.epochs)."""
        if self._epochs is None:
            return None
        return batches_left(position, self._epochs, self.progress.num_examples,
                            self.progress.batch_size)

    def _settled(self, session, step: int, read: Stored) -> Stored:
        """The data state the job goes on with at `step`, from `read` (as first read):
        rebased onto the job's data, or, by a process that does not rebase, awaited."""
        deadline = time.monotonic() + self._wait_secs
        while True:
            stored = self._at_lowest(session, read, step)
            settled, change = reconcile(stored, self._state.wanted, step)
            if change is None:
                return settled
            if self._rebases:
                if self._positions is not None:  # first: the others wait for the state
                    at = settled.progress.position(step)
                    self._positions.set(session, [at] * self._positions.workers)
                self._state.write(session, settled)
                if self._announce:
                    self._write(change)
                return settled
            moved_on = int(session.run(self._global_step)) > step
            if time.monotonic() > deadline or moved_on:
                raise self._unsettled(stored, moved_on, change)
            time.sleep(WAIT_POLL_SECS)
            read = self._state.read(session)

    def _at_lowest(self, session, stored: Stored, step: int) -> Stored:
        """An asynchronous job's state as it stands at step ``step``: at the lowest
        worker position (its base is moved only by a save or a change)."""
        if self._positions is None:
            return stored
        low = min(self._positions.read(session))
        return Stored(dataclasses.replace(stored.progress, base_step=step, base_position=low),
                      stored.seed, stored.files)

    def _unsettled(self, stored: Stored, moved_on: bool, change: str) -> Exception:
        """Why the state the chief keeps never became this worker's: the chief trains (it
        settles before its first step) or the wait ran out, on other data or another
        train.batch_size than this worker's (bad input: a restart would meet them
        again), or the chief never settled it."""
        wanted = self._state.wanted
        when = "the chief trains" if moved_on else f"after {self._wait_secs:g} s"
        differ = _data_change(stored, wanted)
        if differ:
            return BadInput(
                f"this worker's data differ from the chief's (the chief's -> this worker's: "
                f"{differ}; {when}): every worker of a ps/worker job reads the same data; "
                "give each the same data.path files and data.seed")
        if moved_on:
            return BadInput(
                f"this worker's train.batch_size, {wanted.progress.batch_size}, is not the "
                f"chief's, {stored.progress.batch_size}: every worker of a ps/worker job "
                "runs the same job file")
        return PeerUnavailable(f"the chief did not settle the data position within "
                               f"{self._wait_secs:g} s ({change})")

    def examples_trained(self, step: int) -> int:
        """The positions the job's steps have taken, up to step ``step``."""
        if self._latest is not None:
            return positions_trained(self._latest, self._positions.parts,
                                     self.progress.batch_size)
        return self.progress.position(step) if self.progress else 0

    def epoch(self, step: int) -> float:
        """The passes over the data done at step ``step``."""
        if not self.progress:
            return 0.0
        return self.examples_trained(step) / self.progress.num_examples
