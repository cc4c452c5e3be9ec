"""build_train_op: split the batch, build the towers, combine their gradients, apply one update."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import tensorflow as tf

from towers import gradients as grad_lib
from towers.builder import Tower, build_towers, move_to_replica_copies
from towers.context import Features, ModelFn
from towers.placement import DeviceFn, least_loaded
from towers.split import split_batch

VARIABLE_UPDATES = ("parameter_server", "replicated")

# Maps a list of gradients (tensors, IndexedSlices or None) to a list of the same length.
GradientsFn = Callable[[list], list]


class TrainOps(NamedTuple):
    """What the caller runs and watches.

    train_op: one step: the update, the global-step increment and tower 0's
        batch-norm statistics updates.
    loss: scalar, the example-weighted mean loss over the global batch.
    metrics: scalars, each the example-weighted mean of the towers' metric.
    global_step: the int64 step variable.
    gradient_norm: scalar, global norm of the combined gradient before clipping.
    sync_op: copies tower 0's variables (and optimizer slots) into the other
        towers' copies; run it after initialising or restoring. A no-op in
        parameter_server mode, where only one copy exists.
    """

    train_op: tf.Operation
    loss: tf.Tensor
    metrics: dict[str, tf.Tensor]
    global_step: tf.Variable
    gradient_norm: tf.Tensor
    sync_op: tf.Operation


class EvalOps(NamedTuple):
    """loss and metrics: scalars, example-weighted means over the global batch."""

    loss: tf.Tensor
    metrics: dict[str, tf.Tensor]


def build_train_op(
    model_fn: ModelFn,
    features: Features,
    labels: tf.Tensor,
    optimizer: tf.compat.v1.train.Optimizer,
    devices: Sequence[str],
    variable_update: str = "parameter_server",
    param_device: str | DeviceFn = "/cpu:0",
    clip_norm: float | None = None,
    global_step: tf.Variable | None = None,
    aggregation_device: str | None = None,
    cross_process: GradientsFn | None = None,
) -> TrainOps:
    """Build a data-parallel training step over `devices`.

    features: a tensor or dict of tensors, leading dimension the global batch B.
    labels: [B, ...]. Each of the N devices gets B/N examples (sizes differ by
    at most one); the update equals a single-device step on the whole batch.
    param_device: where variables live in parameter_server mode: a device
        string, "least_loaded" (spread over `devices` by byte size), or a device
        function of the variable op (for replica_device_setter).
    aggregation_device: parameter_server mode: where tower gradients are summed;
        None sums on each variable's device. A ps/worker job's worker passes its
        own CPU so it sends one gradient per variable to the ps tasks.
    cross_process: parameter_server mode: combines this process's summed
        gradients (a list aligned with the trainable variables; entries are
        tensors, IndexedSlices or None) with other processes' (Horovod's
        all-reduce), before clipping, so the norm clipped is the whole job's.
    """
    devices = _check_devices(devices)
    if variable_update not in VARIABLE_UPDATES:
        raise ValueError(
            f"variable_update must be one of {', '.join(VARIABLE_UPDATES)}; got {variable_update!r}"
        )
    if cross_process is not None and variable_update != "parameter_server":
        raise ValueError("cross_process needs variable_update='parameter_server'")
    if clip_norm is not None and clip_norm <= 0:
        raise ValueError(f"clip_norm must be positive, got {clip_norm}")
    replicated = variable_update == "replicated"
    home = _aggregation_device(param_device, devices)
    if global_step is None:
        with tf.device(home):
            global_step = tf.compat.v1.train.get_or_create_global_step()

    with tf.name_scope("split_batch"):
        shards = split_batch(features, labels, len(devices))
    towers = build_towers(
        model_fn,
        shards,
        devices,
        _variable_device(param_device, devices),
        is_training=True,
        replicated=replicated,
    )
    weights = _example_weights(towers, home)
    tower_grads = [_tower_gradients(t, w) for t, w in zip(towers, weights, strict=True)]

    if replicated:
        apply_op, norm = _apply_replicated(towers, tower_grads, optimizer, clip_norm, global_step)
        sync_op = _sync_replicas(towers, optimizer)
    else:
        summed = grad_lib.aggregate(tower_grads, towers[0].trainable, aggregation_device)
        with tf.device(aggregation_device or home):
            if cross_process is not None:
                summed = cross_process(summed)
            summed, norm = grad_lib.clip_by_global_norm(summed, clip_norm)
        apply_op = optimizer.apply_gradients(_pairs(summed, towers[0].trainable), global_step)
        sync_op = tf.no_op(name="sync_replicas")

    # Batch-norm moving statistics are updated from tower 0 alone: every tower's
    # batch statistics estimate the same population, so one tower's suffice, and
    # N towers assigning to one variable in the same step would race, costing
    # N-1 cross-device copies for nothing (as in tf_cnn_benchmarks).
    update_ops = tf.compat.v1.get_collection(
        tf.compat.v1.GraphKeys.UPDATE_OPS, scope=towers[0].name_scope
    )
    train_op = tf.group(apply_op, *update_ops, name="train_op")
    loss, metrics = _combine_outputs(towers, weights, home)
    return TrainOps(train_op, loss, metrics, global_step, norm, sync_op)


def build_eval_ops(
    model_fn: ModelFn,
    features: Features,
    labels: tf.Tensor,
    devices: Sequence[str],
    param_device: str | DeviceFn = "/cpu:0",
) -> EvalOps:
    """Evaluation towers (is_training=False) over `devices`, with the training graph's names."""
    devices = _check_devices(devices)
    home = _aggregation_device(param_device, devices)
    with tf.name_scope("split_batch"):
        shards = split_batch(features, labels, len(devices))
    towers = build_towers(
        model_fn, shards, devices, _variable_device(param_device, devices),
        is_training=False, reuse_existing=True,
    )
    loss, metrics = _combine_outputs(towers, _example_weights(towers, home), home)
    return EvalOps(loss, metrics)


def _check_devices(devices: Sequence[str]) -> list[str]:
    if isinstance(devices, str) or not devices:
        raise ValueError(f"devices must be a non-empty list of device strings, got {devices!r}")
    for device in devices:
        if not isinstance(device, str):
            raise ValueError(f"devices must be device strings like '/gpu:0'; got {device!r}")
        tf.DeviceSpec.from_string(device)  # raises ValueError naming a malformed one
    return list(devices)


def _variable_device(param_device: str | DeviceFn, devices: list[str]) -> str | DeviceFn:
    if param_device == "least_loaded":
        return least_loaded(devices)
    return param_device


def _aggregation_device(param_device: str | DeviceFn, devices: list[str]) -> str:
    """Where loss, metrics and the global step live: the parameter device when it is one place."""
    if callable(param_device) or param_device == "least_loaded":
        return devices[0]
    return param_device


def _example_weights(towers: list[Tower], device: str) -> list[tf.Tensor]:
    """Each tower's share of the global batch, float32 scalars summing to 1."""
    with tf.device(device), tf.name_scope("example_weights"):
        counts = [tf.cast(t.num_examples, tf.float32) for t in towers]
        total = tf.add_n(counts)
        return [c / total for c in counts]


def _tower_gradients(tower: Tower, weight: tf.Tensor) -> list:
    """Gradients of the tower's weighted loss, computed on the tower's own device."""
    with tf.name_scope(tower.name_scope), tf.device(tower.device):
        scaled = tower.outputs.loss * tf.cast(weight, tower.outputs.loss.dtype)
        return tf.compat.v1.gradients(scaled, tower.trainable, colocate_gradients_with_ops=True)


def _combine_outputs(
    towers: list[Tower], weights: list[tf.Tensor], device: str
) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
    def weighted_sum(values: list[tf.Tensor]) -> tf.Tensor:
        return tf.add_n([v * tf.cast(w, v.dtype) for v, w in zip(values, weights, strict=True)])

    with tf.device(device), tf.name_scope("combine_towers"):
        loss = weighted_sum([t.outputs.loss for t in towers])
        metrics = {
            name: weighted_sum([tf.cast(t.outputs.metrics[name], tf.float32) for t in towers])
            for name in towers[0].outputs.metrics
        }
    return loss, metrics


def _pairs(grads: list, variables: list[tf.Variable]) -> list[tuple]:
    pairs = [(g, v) for g, v in zip(grads, variables, strict=True) if g is not None]
    if not pairs:
        raise ValueError("the loss depends on no trainable variable: nothing to train")
    return pairs


def _apply_replicated(towers, tower_grads, optimizer, clip_norm, global_step):
    """All-reduce, then one apply_gradients over every tower's copies.

    One call, not one per tower: optimizers with per-step state outside the
    slots (Adam's beta powers) must advance it once per step.
    """
    reduced = grad_lib.all_reduce(tower_grads, [t.device for t in towers])
    pairs, norms = [], []
    for tower, grads in zip(towers, reduced, strict=True):
        # Each tower clips its own copy on its own device; the inputs are
        # identical, so the results are too, with no cross-device wait.
        with tf.device(tower.device):
            clipped, norm = grad_lib.clip_by_global_norm(grads, clip_norm)
        pairs.extend(_pairs(clipped, tower.trainable))
        norms.append(norm)
    apply_op = optimizer.apply_gradients(pairs, global_step)
    for tower in towers[1:]:
        for slot in _slots(optimizer, tower.trainable):
            move_to_replica_copies(slot)
    return apply_op, norms[0]


def _slots(optimizer: tf.compat.v1.train.Optimizer, variables: list[tf.Variable]) -> list:
    found = (optimizer.get_slot(v, name) for v in variables for name in optimizer.get_slot_names())
    return [s for s in found if s is not None]


def _sync_replicas(towers: list[Tower], optimizer: tf.compat.v1.train.Optimizer) -> tf.Operation:
    """Assign tower 0's variables and slots to every other tower's copies."""
    assigns = []
    for tower in towers[1:]:
        for source, copy in zip(towers[0].trainable, tower.trainable, strict=True):
            pairs = [(source, copy)] + [
                (optimizer.get_slot(source, name), optimizer.get_slot(copy, name))
                for name in optimizer.get_slot_names()
            ]
            for src, dst in pairs:
                if src is not None and dst is not None:
                    with tf.device(dst.device):
                        assigns.append(dst.assign(src.read_value()).op)
    return tf.group(*assigns, name="sync_replicas")
