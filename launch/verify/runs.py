"""The runs `towers verify` compares: the job's training step in float64, as `towers train`
builds it (launch.runtime.training_graph.build_step), on one device or on the job's
towers, each in a graph and session of its own, from the same initial values and on
the same batches."""

from __future__ import annotations

import dataclasses
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import tensorflow as tf

import towers
from launch.config import JobConfig
from launch.log import debug
from launch.runtime.inputs import training_input
from launch.runtime.optim import learning_rate, make_optimizer
from launch.runtime.plan import Plan
from launch.runtime.training_graph import build_step, told_as_lines
from launch.verify.float64 import in_float64
from launch.verify.noise import at_rate_zero, draws_in

V1 = tf.compat.v1

FLOAT64 = towers.Precision(towers.FLOAT64)

Batch = tuple[np.ndarray, np.ndarray]  # features [B, ...], labels [B, ...]
Values = dict[str, np.ndarray]  # a graph's saved variables by name


def read_batches(plan: Plan, global_batch: int, steps: int) -> list[Batch]:
    """The job's first `steps` global batches of training data, as `towers train` reads
    them (plan: a process alone, taking the whole batch), float features in float64."""
    with tf.Graph().as_default():
        feed = training_input(plan, global_batch)
        with V1.Session(config=plan.session) as session:
            feed.begin(session, 0, steps)
            batches = [session.run((feed.features, feed.labels)) for _ in range(steps)]
    return [(_float64(x), y) for x, y in batches]


def _float64(features: np.ndarray) -> np.ndarray:
    return features.astype(np.float64) if features.dtype.kind == "f" else features


def reordered(batches: Sequence[Batch], micro_batches: int = 1, seed: int = 1) -> list[Batch]:
    """Each batch's examples in another order (a fixed permutation per batch), each within
    its micro-batch (towers.shard_sizes(B, micro_batches), consecutive): the same step in
    exact arithmetic, other roundings in floating point. (Across micro-batches it would
    be another step: a batch norm normalizes each micro-batch by its own statistics.)"""
    rng = np.random.default_rng(seed)
    out = []
    for x, y in batches:
        order, start = [], 0
        for size in towers.shard_sizes(len(x), micro_batches):
            order.extend(start + _moved(rng, size))
            start += size
        out.append((x[order], y[order]))
    return out


def _moved(rng: np.random.Generator, size: int) -> np.ndarray:
    """A random order of range(size) other than the identity (when there is another)."""
    while True:
        order = rng.permutation(size)
        if size < 2 or (order != np.arange(size)).any():
            return order


class Trained(NamedTuple):
    """A run's final values: every saved variable by name, and each replicated copy's
    (tower_i/<name>) under its variable's name."""

    values: Values
    copies: dict[str, list[np.ndarray]]


class Run:
    """The job's step in float64 on `plan`'s devices, built once; `train` runs it from given
    initial values. job: its accumulate_steps, optimizer, batch norm and the rest as
    `towers train` takes them. write: where the build's notices go."""

    def __init__(self, job: JobConfig, plan: Plan, batch: Batch, write: Callable[[str], None]):
        self.graph = tf.Graph()
        with self.graph.as_default():
            # As towers train seeds a process: the graph, and Python's generator, from
            # which Keras draws its layers' seeds.
            V1.set_random_seed(job.train.seed)
            random.seed(job.train.seed)
            x, y = batch
            self.features = V1.placeholder(tf.as_dtype(x.dtype), x.shape, name="features")
            self.labels = V1.placeholder(tf.as_dtype(y.dtype), y.shape, name="labels")
            mode = plan.variable_update()
            with V1.device(mode.step_device(plan.devices)):
                global_step = V1.train.get_or_create_global_step()
            rate = learning_rate(job.optimizer, global_step, job.train.batch_size)
            optimizer = make_optimizer(job.optimizer, rate)
            with told_as_lines(write), at_rate_zero() as silenced:
                self.ops = build_step(job, plan, self.features, self.labels, optimizer, mode,
                                      global_step)
            self.silenced: Counter = silenced
            self.draws = draws_in([t.loss for t in self.ops.tower_outputs])
            self.saved = {v.op.name: v for v in V1.global_variables()}
            self.copies = {v.op.name: v for v in V1.get_collection(towers.REPLICA_COPIES)}
            self._given = {name: V1.placeholder(v.dtype.base_dtype, v.shape)
                           for name, v in self.saved.items()}
            self._load = tf.group(*[v.assign(self._given[name]) for name, v in
                                    self.saved.items()], name="load_initial_values")
            self._local_init = V1.local_variables_initializer()
        self.session = V1.Session(graph=self.graph, config=_session_config(plan))

    def initial(self) -> Values:
        """The variables as the job's initialisers make them."""
        self.session.run(self.ops.init_op)
        return self.session.run(self.saved)

    def train(self, start: Values, batches: Sequence[Batch]) -> Trained:
        """One step per batch from `start` (every saved variable's value, by name)."""
        began = time.monotonic()
        self.session.run(self._load, {self._given[name]: start[name] for name in self.saved})
        # What the start does not hold: local variables, then the replicas, from it.
        self.session.run(self._local_init)
        self.session.run(self.ops.sync_op)
        debug(f"verify: started from the given values in {time.monotonic() - began:.2f} s")
        for x, y in batches:
            began = time.monotonic()
            self.session.run(self.ops.train_op, {self.features: x, self.labels: y})
            debug(f"verify: a step in {time.monotonic() - began:.2f} s")
        copies: dict[str, list[np.ndarray]] = {}
        for name, value in self.session.run(self.copies).items():
            copies.setdefault(name.split("/", 1)[1], []).append(value)
        return Trained(self.session.run(self.saved), copies)

    def close(self) -> None:
        self.session.close()


def one_device(plan: Plan) -> Plan:
    """The reference: the job's step on the plan's first device alone, in float64. Its
    micro-batches are the job's (train.accumulate_steps): a batch norm normalizes each
    micro-batch by its own statistics, on one device as on towers, so the job's step on
    one device is what the towers must equal."""
    return _in_float64(dataclasses.replace(plan, devices=plan.devices[:1],
                                           sharing="parameter_server", aggregation=None))


def on_towers(plan: Plan) -> Plan:
    """The job's towers, update mode and micro-batches, in float64."""
    return _in_float64(plan)


def _in_float64(plan: Plan) -> Plan:
    """The plan computing in float64, its model's own float32 casts too (verify.float64)."""
    model = dataclasses.replace(plan.model, model_fn=in_float64(plan.model.model_fn))
    return dataclasses.replace(plan, model=model, precision=FLOAT64)


def _session_config(plan: Plan) -> V1.ConfigProto:
    """The job's session, without Grappler's rewriting: each graph runs as built (and
    builds in a fraction of the time)."""
    config = V1.ConfigProto()
    config.CopyFrom(plan.session)
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    return config
