"""``cluster.backend: horovod``, `towers train` under horovodrun: one process per rank,
gradients all-reduced by Horovod.

    horovodrun -np 2 -H localhost:2 towers train -c job.yaml --backend horovod

The job file means the same as in-process: `train.batch_size` is the global batch,
split across ranks (and across towers inside a rank), each rank reading its own
shard of the data, so every step is the update one process would make on the
whole batch. Rank 0 alone restores, writes checkpoints and summaries, and logs;
after the session starts it broadcasts its variables (restored or freshly
initialised) to the other ranks. Every rank serves metrics on metrics.port + rank.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType

import tensorflow as tf

import towers
from launch import metrics
from launch.config import JobConfig
from launch.config.arrangements import HorovodRules
from launch.devices import DeviceError
from launch.distributed.cluster import Task
from launch.distributed.health.rank_reports import RankReports, rendezvous_url
from launch.distributed.health.stop_vote import StopVoteHook
from launch.distributed.health.stragglers import StragglerWatch
from launch.errors import BadInput, PeerUnavailable
from launch.log import log
from launch.metrics.throughput import job_examples_per_global_step
from launch.runtime.plan import Plan, Share, make_plan
from launch.runtime.role import Role
from launch.runtime.signals import StopSignals
from launch.runtime.train import train as train_job

V1 = tf.compat.v1

# What a collective raises in a rank still running once another rank has left: Horovod's
# own error once it has shut down, or Gloo's, from a connection the leaving rank closed
# mid-exchange (the soak, horovod seed 629: "[.../gloo/transport/tcp/pair.cc:589] Read
# error [127.0.0.1]:15284: Connection reset by peer").
RANK_LEFT = re.compile(r"Horovod has been shut down|gloo/transport/\S+ (Read|Write) error "
                       r".*(reset by peer|closed by peer|Broken pipe)")

INSTALL = (
    "horovod is not installed; install it with `make horovod` "
    "(docker/install-horovod.sh builds it against this TensorFlow, some minutes "
    "the first time, cached afterwards)"
)


class HorovodError(BadInput):
    """Horovod is missing, or the job cannot run under it as configured."""


def load() -> ModuleType:
    """horovod.tensorflow, or HorovodError with how to install it."""
    try:
        import horovod.tensorflow as hvd
    except ImportError as err:
        raise HorovodError(f"{INSTALL} ({err})") from None
    return hvd


def version() -> str:
    return importlib.metadata.version("horovod")


@dataclass(frozen=True)
class Rank:
    """This process's place in the Horovod job: rank of size, local_rank on its host."""

    rank: int
    size: int
    local_rank: int


def rank_job(job: JobConfig, rank: Rank, num_host_gpus: int) -> JobConfig:
    """The job as this rank runs it: its own GPUs and metrics port.

    Each rank pins towers.devices GPUs (1 for auto) starting at local_rank times
    that many, so ranks on one host never share a GPU. On a host without GPUs a
    rank builds its towers on CPU devices (1 for auto: one process per rank).
    What a job cannot do under Horovod was refused as it loaded (HorovodRules.check):
    towers.devices is a count here, or auto.
    """
    count = 1 if job.towers.devices == "auto" else job.towers.devices
    session = job.session
    if num_host_gpus:
        first = rank.local_rank * count
        if first + count > num_host_gpus:
            raise DeviceError(
                f"towers.devices: local rank {rank.local_rank} needs GPUs {first}..."
                f"{first + count - 1} but this host has {num_host_gpus}; run fewer ranks per host"
            )
        pinned = ",".join(str(i) for i in range(first, first + count))
        session = dataclasses.replace(session, visible_devices=pinned)
    port = job.metrics.port
    if port:  # 0 (any free port) stays 0
        port += rank.rank
        if port > 65535:
            raise HorovodError(f"metrics.port: {job.metrics.port} + rank {rank.rank} exceeds 65535")
    return dataclasses.replace(
        job,
        towers=dataclasses.replace(job.towers, devices=count),
        session=session,
        metrics=dataclasses.replace(job.metrics, port=port),
    )


def rank_plan(job: JobConfig, rank: Rank, hvd: ModuleType) -> Plan:
    """The in-process plan for this rank's towers, fed this rank's share of each batch."""
    plan = make_plan(job, Share(rank.rank, rank.size))
    batch = job.train.batch_size
    return dataclasses.replace(
        plan,
        reduce_gradients=all_reduce(hvd, share=plan.process_batch_size / batch),
        global_step_examples=job_examples_per_global_step(batch, rank.size, rank.size),
        sum_across_processes=sum_over_ranks(hvd),
        pack_bytes=0,  # Horovod fuses tensors itself (HOROVOD_FUSION_THRESHOLD)
    )


def sum_over_ranks(hvd: ModuleType) -> Callable[[tf.Tensor], tf.Tensor]:
    """A tensor summed over every rank (synchronized batch norm's statistics, the stop
    vote)."""
    return lambda value: hvd.allreduce(value, op=hvd.Sum)


def all_reduce(hvd: ModuleType, share: float) -> Callable[[list], list]:
    """Sum every rank's gradient weighted by its share of the global batch.

    Each rank's towers give the gradient of the mean loss over its own examples;
    weighting by share (examples here / global batch) and summing gives the
    gradient of the mean over the global batch, also when ranks' shares differ.
    Sparse gradients (IndexedSlices) stay sparse: Horovod all-gathers them.
    """

    def reduce(grads: list) -> list:
        with tf.name_scope("horovod_all_reduce"):
            return [None if g is None else hvd.allreduce(_scaled(g, share), op=hvd.Sum)
                    for g in grads]

    return reduce


def _scaled(grad, share: float):
    if isinstance(grad, tf.IndexedSlices):
        values = grad.values * tf.cast(share, grad.values.dtype)
        return tf.IndexedSlices(values, grad.indices, grad.dense_shape)
    return grad * tf.cast(share, grad.dtype)


class BroadcastHook(V1.train.SessionRunHook):
    """After the session starts, give every rank rank 0's variables.

    Horovod's own BroadcastGlobalVariablesHook needs tf.estimator, gone from
    TensorFlow 2.21. Rank 0 has restored its checkpoint (or initialised) by
    then; the global step is a global variable, so a resumed job resumes at the
    same step on every rank. sync_op then refreshes per-tower copies, if any.
    """

    def __init__(self, hvd: ModuleType, sync_op: tf.Operation):
        self._hvd = hvd
        self._sync_op = sync_op
        self._broadcast = None

    def begin(self) -> None:
        self._broadcast = self._hvd.broadcast_global_variables(0)

    def after_create_session(self, session, coord) -> None:
        session.run(self._broadcast)
        session.run(self._sync_op)


class HorovodRole(Role):
    """A Horovod rank: initialises its own variables, rank 0 alone writes, and every
    rank receives rank 0's variables once the session starts."""

    def __init__(self, hvd: ModuleType, rank: Rank, job: JobConfig,
                 write: Callable[[str], None], exporter: metrics.Exporter | None):
        super().__init__(writes=rank.rank == 0, label=f"rank{rank.rank}")
        self._hvd, self._rank = hvd, rank
        url = rendezvous_url()
        stragglers = StragglerWatch.for_job(job.train, write, exporter) if rank.rank == 0 \
            else None
        self._stragglers = stragglers
        self._reports = RankReports(url, rank.rank, rank.size, stragglers) if url else None

    def stragglers(self) -> list[str]:
        return self._stragglers.named if self._stragglers is not None else []

    def start_hooks(self, ops: towers.TrainOps) -> list[V1.train.SessionRunHook]:
        # First, so every rank holds rank 0's global step before any hook reads it: a
        # finished job run again then takes no step on any rank.
        return [BroadcastHook(self._hvd, ops.sync_op)]

    def hooks(self, ops: towers.TrainOps, data_end, phases=None,
              follow=None) -> list[V1.train.SessionRunHook]:
        if self._reports is None:
            return []
        if phases is not None:
            phases.listen(self._reports.times.on_phases)
        return [self._reports]

    def stop_hook(self, stop: StopSignals) -> V1.train.SessionRunHook:
        """Every rank stops after the same step: horovodrun signals each rank on its own,
        and a rank stopping a step early would leave the others in an all-reduce it
        never joins (Horovod then shuts down with an error)."""
        return StopVoteHook(stop, sum_over_ranks(self._hvd))

    def stall_cause(self) -> str:
        silent = self._reports.silent() if self._reports is not None else []
        if silent:
            return (f"ranks not reporting: {', '.join(silent)}; the collective waits for "
                    "them")
        return ("a collective waits for ranks that have not joined it: Horovod's stall "
                "check names them on rank 0 (\"missing ranks\"), after "
                "train.stall_warning_secs too")

    def finish(self, result: dict) -> dict:
        return {**result, "rank": self._rank.rank, "size": self._rank.size}


class Horovod(HorovodRules):
    """Horovod ranks: each `towers train` process under horovodrun is one."""

    def run(self, job: JobConfig, task: Task | None = None,
            write: Callable[[str], None] = log) -> dict:
        return train(job, write)


def train(job: JobConfig, write: Callable[[str], None] = log) -> dict:
    """Run this process's rank of a Horovod job; return its final record with rank and size."""
    hvd = load()
    _check_stalls_after(job.train.stall_warning_secs)
    hvd.init()
    rank = Rank(hvd.rank(), hvd.size(), hvd.local_rank())
    if rank.rank != 0:
        write = _silent  # horovodrun interleaves every rank's output; rank 0 speaks for all
    job = rank_job(job, rank, len(tf.config.list_physical_devices("GPU")))
    identity = metrics.Identity("train", rank.rank, job.run.name, rank=rank.rank)
    with metrics.serve(job.metrics, identity, write) as exporter:
        plan = rank_plan(job, rank, hvd)
        write(f"horovod {version()}: rank {rank.rank} of {rank.size}, "
              f"{plan.process_batch_size} of every {job.train.batch_size} examples")
        role = HorovodRole(hvd, rank, job, write, exporter)
        with ranks_leaving(rank.rank):
            return train_job(job, plan=plan, role=role, exporter=exporter, write=write)


@contextlib.contextmanager
def ranks_leaving(rank: int) -> Iterator[None]:
    """A collective that failed because another rank left the job ends this one with 138
    (retryable) and one line; any other error is left as it is."""
    try:
        yield
    except tf.errors.OpError as err:
        if not RANK_LEFT.search(err.message or ""):
            raise
        raise PeerUnavailable(
            f"horovod: rank {rank}'s collective failed: another rank has left the job. "
            "Restart the job: training resumes from the last checkpoint") from None


def _check_stalls_after(seconds: float) -> None:
    """Horovod's own stall check (rank 0 names the ranks a collective still waits for)
    runs after train.stall_warning_secs, unless the environment already sets it."""
    os.environ.setdefault("HOROVOD_STALL_CHECK_TIME_SECONDS", str(max(1, round(seconds))))


def _silent(message: str) -> None:
    pass
