"""The towers of one step and their gradients, over one or several micro-batches.

With `micro_batches` k > 1 the global batch is cut into k consecutive micro-batches
(sizes differing by at most one), each split across the towers as a whole batch
would be, and the towers are built once per micro-batch in the same graph. Every
tower gradient is weighted by its examples' share of the *global* batch, and each
tower sums its k gradients, so the sum the update mode then combines is the gradient
of the mean loss over the whole batch, exactly as without accumulation.

Tower i of micro-batch m waits (a control dependency) for tower i's gradients of
micro-batch m - 1, so a device holds one micro-batch's activations at a time: a
global batch k times larger than fits trains with one update. One session run is
still one update (the global step, hooks, SyncReplicasOptimizer and Horovod see
nothing different); the price is a graph k times larger and, with variables on
other devices (ps/worker), k reads of each variable per step.

Micro-batch 0 keeps the names a step without accumulation has (`tower_i/...`);
micro-batch m builds under `micro_batch_m/`. Batch-norm statistics are updated from
micro-batch 0's tower 0 only (train_op takes UPDATE_OPS from its scope).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import NamedTuple

import tensorflow as tf

from towers import gradients as grad_lib
from towers.batch_stats import CrossTowerSums
from towers.builder import Tower, build_towers
from towers.context import Features, ModelFn
from towers.loss_scale import LossScaler
from towers.made_variables import MadeVariables
from towers.precision import Precision
from towers.sharing import VariableSharing
from towers.split import Shard, split_micro_batches


class Step(NamedTuple):
    """The towers of one training step.

    towers: micro-batch 0's towers, one per device: the variables and devices the
        update mode combines gradients for.
    built: every tower of every micro-batch (k * N), for the loss and metrics.
    weights: each built tower's share of the global batch (scalars of the precision's
        loss_dtype, sum 1).
    gradients: gradients[i][j], tower i's gradient for towers[i].trainable[j]: summed
        over the micro-batches, weighted, unscaled, in the precision's gradient dtype.
    """

    towers: list[Tower]
    built: list[Tower]
    weights: list[tf.Tensor]
    gradients: list[list]


def build_step(
    model_fn: ModelFn,
    features: Features,
    labels: tf.Tensor,
    devices: Sequence[str],
    sharing: VariableSharing,
    home: str,
    *,
    micro_batches: int,
    precision: Precision,
    scaler: LossScaler | None,
    xla: bool,
    batch_sums: Callable[[], CrossTowerSums | None] = lambda: None,
    positions: tf.Tensor | None = None,
    seed: int = 0,
) -> Step:
    """Split the global batch (features [B, ...], labels [B, ...]) into micro-batches and
    those across `devices`; build every tower and its weighted gradients.

    sharing: what each tower's variables are (the update mode's, towers.sharing).
    home: where the example weights are computed.
    batch_sums: makes the sums across towers of each micro-batch (synchronized batch
        norm: a micro-batch is normalized by its own statistics, as one device running
        that micro-batch would); None for each tower's own statistics.
    positions: int64 [B], the examples' positions, which key their random draws (with
        ``seed``: TowerContext.draws); None: the towers draw none of their own."""
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
        raise ValueError(f"accumulate_steps must be a positive integer, got {micro_batches!r}")
    with tf.name_scope("split_batch"):
        splits = split_micro_batches(features, labels, len(devices), micro_batches, positions)
    weights = _example_weights(splits, home, precision.loss_dtype)
    built: list[Tower] = []
    sums: list[list] = []
    made = MadeVariables()  # every micro-batch reads the Keras variables of the first
    for m, shards in enumerate(splits):
        after = [_tensors_of(grads) for grads in sums] if sums else None
        with tf.name_scope(f"micro_batch_{m}") if m else contextlib.nullcontext():
            towers = build_towers(model_fn, shards, devices, sharing, is_training=True,
                                  reuse_existing=m > 0, precision=precision, xla=xla,
                                  after=after, made=made, batch_sums=batch_sums(), seed=seed)
        if m:
            _check_same_variables(built[: len(devices)], towers, m)
        tower_weights = weights[m * len(devices): (m + 1) * len(devices)]
        grads = [_tower_gradients(t, w, scaler) for t, w in zip(towers, tower_weights,
                                                                 strict=True)]
        sums = grads if not sums else [
            _accumulate(t, total, g) for t, total, g in zip(towers, sums, grads, strict=True)]
        built += towers
    first = built[: len(devices)]
    sent = [_outgoing(t, grads, precision, scaler) for t, grads in zip(first, sums, strict=True)]
    return Step(first, built, weights, sent)


def _example_weights(splits: list[list[Shard]], device: str,
                     dtype: tf.DType = tf.float32) -> list[tf.Tensor]:
    """Each shard's share of the global batch, scalars of `dtype` (the towers' losses')
    summing to 1."""
    with tf.device(device), tf.name_scope("example_weights"):
        counts = [tf.cast(s.num_examples, dtype) for shards in splits for s in shards]
        total = tf.add_n(counts)
        return [c / total for c in counts]


def _tower_gradients(tower: Tower, weight: tf.Tensor, scaler: LossScaler | None) -> list:
    """Gradients of the tower's weighted (and loss-scaled) loss, on the tower's device."""
    with tf.name_scope(tower.name_scope), tf.device(tower.device):
        scaled = tower.outputs.loss * tf.cast(weight, tower.outputs.loss.dtype)
        if scaler is not None:
            scaled = scaler.scale_loss(scaled)
        return tf.compat.v1.gradients(scaled, tower.trainable, colocate_gradients_with_ops=True)


def _accumulate(tower: Tower, total: list, grads: list) -> list:
    """The running sum of a tower's gradients over micro-batches, on its device."""
    with tf.name_scope(tower.name_scope), tf.device(tower.device), tf.name_scope("accumulate"):
        return [grad_lib.sum_gradients([t, g]) for t, g in zip(total, grads, strict=True)]


def _outgoing(tower: Tower, grads: list, precision: Precision,
              scaler: LossScaler | None) -> list:
    """A tower's summed gradients as they leave its device: unscaled, in the wire type."""
    with tf.name_scope(tower.name_scope), tf.device(tower.device), tf.name_scope("send"):
        if scaler is not None:
            grads = [scaler.unscale(g) for g in grads]
        return [precision.send(g) for g in grads]


def _tensors_of(grads: list) -> list[tf.Tensor]:
    """The tensors a gradient list is made of, for a control dependency."""
    out = []
    for grad in grads:
        if isinstance(grad, tf.IndexedSlices):
            out += [grad.values, grad.indices]
        elif grad is not None:
            out.append(grad)
    return out


def _check_same_variables(first: list[Tower], later: list[Tower], micro_batch: int) -> None:
    for a, b in zip(first, later, strict=True):
        if [id(v) for v in a.trainable] != [id(v) for v in b.trainable]:
            raise ValueError(
                f"micro-batch {micro_batch}, tower {b.index}: the model function read other "
                f"trainable variables than in micro-batch 0; it must make the same "
                f"variables every time it is called")
