"""Build a tower per device: the model function called under one name scope each, its
compute on the tower's device, its variables handed out by towers.sharing."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import tensorflow as tf

from towers import keras_random, keras_sync, model_checks, state_updates
from towers.batch_stats import CrossTowerSums
from towers.context import ModelFn, TowerContext, TowerOutputs, as_tower_outputs, own_collection
from towers.example_random import ExampleDraws
from towers.made_variables import MadeVariables
from towers.placement import tower_device_fn
from towers.precision import Precision
from towers.sharing import TowerVariables, VariableSharing
from towers.split import Shard


@dataclass
class Tower:
    """One built tower: its outputs, the variables its gradients are taken against, and
    (a training build) its model's state updates (towers.state_updates)."""

    index: int
    device: str
    name_scope: str
    outputs: TowerOutputs
    num_examples: tf.Tensor
    trainable: list[tf.Variable] = field(default_factory=list)
    state_updates: list[tf.Operation] = field(default_factory=list)


def build_towers(
    model_fn: ModelFn,
    shards: Sequence[Shard],
    devices: Sequence[str],
    sharing: VariableSharing,
    *,
    is_training: bool,
    reuse_existing: bool = False,
    precision: Precision | None = None,
    xla: bool = False,
    after: Sequence[Sequence[tf.Tensor]] | None = None,
    made: MadeVariables | None = None,
    batch_sums: CrossTowerSums | None = None,
    seed: int = 0,
) -> list[Tower]:
    """Build one tower per device; `sharing` says what each tower's variables are and
    where they live (towers.sharing: tower 0 creates them, later towers are handed
    tower 0's or copies).

    While a tower is built, the LOSSES collection holds only that tower's entries,
    so `tf.compat.v1.losses.get_total_loss()` is the tower's own loss.
    reuse_existing: tower 0 reuses variables already in the graph (evaluation
    beside training, or a later micro-batch) instead of insisting on creating them.
    precision: the tower computes in its type, cast at the tower's edges.
    xla: each tower is compiled with XLA (its gradients too, when taken later).
    after: after[i] are tensors tower i's ops wait for (a micro-batch waits for the
        previous one's gradients).
    batch_sums: the sums across these towers for synchronized batch norm: Keras'
        BatchNormalization(synchronized=True) uses them, and with every_batch_norm
        every Keras BatchNormalization does and each tower's context carries them
        (TowerContext.batch_sum); None: one tower and process, nothing to synchronize.
    made: the variables made without get_variable in an earlier build of the same
        towers (a later micro-batch), handed out again; None: a new build.
    seed: the seed of the examples' own random draws (TowerContext.draws), for shards
        that carry their positions.
    """
    precision = precision or Precision()
    if len(shards) != len(devices):
        raise ValueError(f"{len(shards)} shards for {len(devices)} devices")
    variables = TowerVariables(sharing, made, reuse_existing)
    towers: list[Tower] = []
    every_batch_norm = bool(batch_sums and batch_sums.every_batch_norm)
    for i, (shard, device) in enumerate(zip(shards, devices, strict=True)):
        tower_sum = batch_sums.for_tower(i) if batch_sums else None
        draws = None if shard.positions is None else ExampleDraws(shard.positions, seed)
        ctx = TowerContext(i, len(devices), device, is_training, shard.num_examples,
                           precision.compute_dtype,
                           tower_sum if every_batch_norm else None,
                           draws)
        graph = tf.compat.v1.get_default_graph()
        outer = graph.get_name_scope()
        name_scope = f"{outer}/tower_{i}/" if outer else f"tower_{i}/"
        first_op = len(graph.get_operations())
        with (
            model_checks.own_placements() if i == 0 and not reuse_existing
            else contextlib.nullcontext() as placed,
            variables.variable_scope(i, precision, name_scope),
            tf.compat.v1.name_scope(f"tower_{i}") as scope,
            tf.compat.v1.device(tower_device_fn(device, sharing.device(device))),
            variables.tower(i, device, scope),
            own_collection(tf.compat.v1.GraphKeys.LOSSES),
            tf.control_dependencies(after[i] if after else []),
            tf.xla.experimental.jit_scope() if xla else contextlib.nullcontext(),
            precision.keras_layers(),
            keras_sync.synchronized_moments(tower_sum, every=every_batch_norm),
            keras_random.tower_seeds(i, shard.positions),
        ):
            features = precision.cast_features(shard.features)
            outputs = precision.cast_outputs(
                as_tower_outputs(model_fn(features, shard.labels, ctx)))
        _check_scalar(outputs, i)
        if placed:  # noted in a new build's tower 0 only: one warning, not one per tower
            warnings.warn(model_checks.placement_warning(placed), UserWarning, stacklevel=4)
        made_ops = graph.get_operations()[first_op:]
        trainable = variables.trainable(i)
        if is_training and i == 0 and not reuse_existing:
            model_checks.check_first_tower(made_ops, trainable, variables.made.first, precision)
        updates = state_updates.of_tower(made_ops) if is_training else []
        towers.append(Tower(i, device, scope, outputs, shard.num_examples, trainable, updates))
    return towers


def _check_scalar(outputs: TowerOutputs, index: int) -> None:
    tensors = {"loss": outputs.loss, **{f"metrics['{k}']": v for k, v in outputs.metrics.items()}}
    for what, tensor in tensors.items():
        if tensor.shape.rank not in (0, None):
            raise ValueError(
                f"tower {index}: model_fn's {what} must be a scalar, got shape {tensor.shape}"
            )
