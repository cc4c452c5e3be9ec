"""``cluster.backend: collective``, a job with no ps tasks: a full copy of the variables on
every worker, the
workers' gradients all-reduced with TensorFlow's collective ops over the gRPC servers
the job already runs (towers.collectives), synchronous by construction.

    towers local-cluster --ps 0 --workers 2
    towers worker -c job.yaml --worker-hosts h1:2222,h2:2222 --task-index 0

Every worker initialises its own variables; the chief alone restores and writes
checkpoints and summaries, and broadcasts its variables to the others as the session
starts (before any hook reads the global step, so every worker starts at the chief's
step). Checkpoints hold the same variables as any other mode's. Every worker steps
together, so a stop must be too: a stop signal is a vote all-reduced with each step,
and every worker stops after the first step any worker voted in. A worker that dies
or is cut off leaves the others' steps waiting on it; the step deadline ends them
with 138, naming it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Callable, Iterator

import tensorflow as tf

import towers
from launch import metrics
from launch.config import ClusterConfig, JobConfig
from launch.config.arrangements import CollectiveRules
from launch.distributed.cluster import Task
from launch.distributed.cluster.peers import wait_for_peers
from launch.distributed.cluster.server import start_server
from launch.distributed.health.liveness import not_answering
from launch.distributed.health.step_deadline import StepDeadline, stuck_step
from launch.distributed.health.stop_vote import StopVoteHook
from launch.errors import PeerUnavailable
from launch.log import log
from launch.metrics.throughput import job_examples_per_global_step
from launch.runtime.plan import Plan, Share, make_plan
from launch.runtime.role import Role
from launch.runtime.signals import StopSignals
from launch.runtime.train import train

V1 = tf.compat.v1
# TensorFlow's errors when a collective meets another run of a worker's device than the
# one its group was formed with (that worker restarted): the group refused to the new
# run, the new run's reply refused to a step of the old group, or the new run, asked
# about the group, no longer held it. Each names the device, or the task, restarted.
RESTARTED_PEER = (
    re.compile(r"Device (\S+) current incarnation doesn't match"),
    re.compile(r'expects a different device incarnation.*?contains the device '
               r'\(\\?"([^"\\]+)\\?"\) was probably restarted', re.DOTALL),
    re.compile(r"remote target (\S+) while calling \S+\n[^\n]*group \d+ failed to resolve"),
)

def collective_plan(job: JobConfig, task: Task) -> tuple[Plan, towers.CollectiveGroup]:
    """This worker's plan (its towers on its devices, its copy of the variables beside
    them, its share of the batch and data) and the collective group it reduces in."""
    base = make_plan(job, Share(*task.share))
    global_batch = job.train.batch_size
    devices = [f"{task.device}{d}" for d in base.devices]
    param = base.param_device
    if param != "least_loaded":
        param = f"{task.device}{param}"
    # The collectives of a group run on one device per worker: where its variables
    # are (one device), else its first tower.
    home = devices[0] if param == "least_loaded" else param
    group = towers.CollectiveGroup(task.num_workers, home)
    plan = dataclasses.replace(
        base,
        devices=devices,
        param_device=param,
        host=f"{task.device}/cpu:0",
        aggregation=home,
        reduce_gradients=towers.weighted_all_reduce(group,
                                                    base.process_batch_size / global_batch),
        global_step_examples=job_examples_per_global_step(
            global_batch, task.num_workers, task.num_workers),
        session=collective_session(base.session, task, job.cluster),
    )
    return plan, group


def collective_session(base: V1.ConfigProto, task: Task, cfg: ClusterConfig) -> V1.ConfigProto:
    """The chief leads the collective group (it resolves which devices take part); the
    device filter keeps this worker's session to its own task; every operation is
    bounded, so a lost peer becomes an error. (TensorFlow's scoped-allocator rewrite,
    which merges side-by-side reductions, is left off: towers.pack_gradients_bytes
    merges them in the graph, where it can be seen and tested.)"""
    config = V1.ConfigProto()
    config.CopyFrom(base)
    chief = "chief" if "chief" in task.cluster else "worker"
    config.experimental.collective_group_leader = f"/job:{chief}/replica:0/task:0"
    del config.device_filters[:]
    config.device_filters.append(task.device)
    config.operation_timeout_in_ms = int(
        max(cfg.operation_timeout_secs, cfg.startup_timeout_secs) * 1000)
    return config


def peers(task: Task) -> dict[str, str]:
    """Every other worker (and the chief): a collective step needs all of them."""
    found = {}
    for job in ("chief", "worker"):
        for index, address in enumerate(task.cluster.get(job, ())):
            if (job, index) != (task.job_name, task.task_index):
                found[f"{job} {index}"] = address
    return found


def lost_peer(task: Task) -> str:
    """What to say when a collective failed on a peer: the peers not answering now."""
    silent = [f"{name} at {a}" for name, a in not_answering(peers(task)).items()]
    who = f"not answering: {', '.join(silent)}" if silent else "every peer answers again"
    return (f"cluster: a collective step lost a worker ({who}); a job without ps tasks "
            "cannot go on without it. Restart every worker: training resumes from the "
            "last checkpoint")


class BroadcastHook(V1.train.SessionRunHook):
    """As the session starts, every worker takes the chief's variables (restored, or
    freshly initialised), then refreshes its towers' copies, if any (sync_op). Placed
    before every other hook, so none reads a variable before it.

    A session is created once. MonitoredSession creates it again after a peer's
    connection broke (UnavailableError), as it would for a restarted ps; but
    TensorFlow aborts a process's collectives for good once one failed ("restart your
    program to reset"), so a second session would wait for ever: the worker ends with
    138 instead (`lost`: the error, naming the peers that do not answer).
    """

    def __init__(self, group: towers.CollectiveGroup, is_source: bool, sync_op: tf.Operation,
                 lost: Callable[[], PeerUnavailable]):
        self._group, self._is_source, self._sync_op = group, is_source, sync_op
        self._lost = lost
        self._broadcast = None
        self._created = False

    def begin(self) -> None:
        self._broadcast = towers.broadcast_variables(
            self._group, V1.global_variables(), self._is_source)

    def after_create_session(self, session, coord) -> None:
        if self._created:
            raise self._lost()
        self._created = True
        session.run(self._broadcast)
        session.run(self._sync_op)


class CollectiveRole(Role):
    """A worker of a collective job: its own session on its own server; every worker
    initialises its copy, the chief alone restores and writes."""

    def __init__(self, job: JobConfig, task: Task, server, group: towers.CollectiveGroup):
        super().__init__(
            master=server.target,
            is_chief=True,  # each initialises its own copy; the broadcast makes them equal
            writes=task.is_chief,
            max_wait_secs=job.cluster.startup_timeout_secs,
            stop_grace_secs=1.0,
        )
        self._task, self._group = task, group
        self.deadline = StepDeadline(job.cluster)
        self.label = task.label

    def start_hooks(self, ops: towers.TrainOps) -> list[V1.train.SessionRunHook]:
        return [BroadcastHook(self._group, self._task.is_chief, ops.sync_op,
                              lambda: PeerUnavailable(lost_peer(self._task)))]

    def hooks(self, ops: towers.TrainOps, data_end, phases=None,
              follow=None) -> list[V1.train.SessionRunHook]:
        return [self.deadline]

    def stall_cause(self) -> str:
        others = ", ".join(f"{name} at {address}" for name, address in peers(self._task).items())
        return (f"a collective step waits for every worker ({others}); one that stopped "
                "holds up all of them")

    def stop_hook(self, stop: StopSignals) -> V1.train.SessionRunHook:
        return StopVoteHook(stop, self._group.all_reduce_sum, self._group.device)

    def finish(self, result: dict) -> dict:
        return {**result, "job": self._task.job_name, "task": self._task.task_index,
                "workers": self._task.num_workers}


class Collective(CollectiveRules):
    """A collective job: every task a worker, training in step with the others."""

    def run(self, job: JobConfig, task: Task | None, write: Callable[[str], None] = log) -> dict:
        return run_collective_worker(job, task, write)


def run_collective_worker(job: JobConfig, task: Task, write: Callable[[str], None] = log) -> dict:
    """Train as this worker of a collective job; metrics (if on) start first."""
    identity = metrics.Identity(task.job_name, task.task_index, job.run.name)
    with metrics.serve(job.metrics, identity, write) as exporter:
        plan, group = collective_plan(job, task)
        server = start_server(task, plan.session, write)
        wait_for_peers(peers(task), job.cluster.startup_timeout_secs, write)
        write(f"worker rank {task.worker_rank} of ranks 0-{task.num_workers - 1}: "
              f"{plan.process_batch_size} examples of every global batch of {job.train.batch_size} "
              f"(part {task.worker_rank + 1} of {task.num_workers}); no ps tasks: variables on "
              "every worker, gradients "
              f"all-reduced by collective ops ({group.communication})")
        role = CollectiveRole(job, task, server, group)
        with peer_failures(task, role.deadline):
            return train(job, plan=plan, role=role, exporter=exporter, write=write)


@contextlib.contextmanager
def peer_failures(task: Task, deadline: StepDeadline) -> Iterator[None]:
    """Collectives that failed on a peer end the worker with 138 (retryable) and one line:
    a step that ran out of its deadline (a peer stopped or cut off), or a collective that
    met another run of a worker than its group was formed with (that worker restarted,
    the others did not: TensorFlow refuses it, "incarnation"). Any other error is left
    as it is."""
    try:
        yield
    except tf.errors.DeadlineExceededError:
        raise PeerUnavailable(stuck_step(task, deadline)) from None
    except tf.errors.FailedPreconditionError as err:
        found = [m for m in (p.search(err.message or "") for p in RESTARTED_PEER) if m]
        if not found:
            raise
        raise PeerUnavailable(
            f"cluster: a collective met another run of {found[0].group(1)} than its group "
            "holds (that worker restarted, the others did not); a job without ps tasks "
            "cannot go on with it. Restart every worker: training resumes from the last "
            "checkpoint") from None
