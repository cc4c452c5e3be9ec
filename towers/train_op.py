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
# What a step with a non-finite loss or gradient does: "apply" it anyway (no check),
# "raise" InvalidArgumentError before anything is updated, or "skip" the update
# (variables, optimizer slots and batch-norm statistics stay as they were; the
# global step still advances, as Keras' LossScaleOptimizer does on overflow).
NONFINITE_POLICIES = ("apply", "raise", "skip")
NONFINITE_LOSS = "non-finite loss"  # in the InvalidArgumentError of the "raise" policy
NONFINITE_GRADIENT = "non-finite gradient"

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
    all_finite: bool scalar, whether the step's loss and gradient norm were
        finite (so the update was applied); None with nonfinite="apply".
    """

    train_op: tf.Operation
    loss: tf.Tensor
    metrics: dict[str, tf.Tensor]
    global_step: tf.Variable
    gradient_norm: tf.Tensor
    sync_op: tf.Operation
    all_finite: tf.Tensor | None = None


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
    nonfinite: str = "apply",
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
        all-reduce), before clipping, so the norm clipped is the whole job's;
        and likewise the loss and metrics, so they are the whole job's.
    nonfinite: one of NONFINITE_POLICIES. "raise" and "skip" check the combined
        loss and the global norm of the combined gradient (non-finite when any
        gradient element is) before the update: "raise" makes the step fail with
        InvalidArgumentError naming NONFINITE_LOSS or NONFINITE_GRADIENT, "skip"
        leaves every variable unchanged. Both also hold back tower 0's UPDATE_OPS.
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
    if nonfinite not in NONFINITE_POLICIES:
        raise ValueError(
            f"nonfinite must be one of {', '.join(NONFINITE_POLICIES)}; got {nonfinite!r}"
        )
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

    loss, metrics = _combine_outputs(towers, weights, home)
    if replicated:
        reduced = grad_lib.all_reduce(tower_grads, [t.device for t in towers])
        pairs, norm = _clip_replicated(towers, reduced, clip_norm)
    else:
        summed = grad_lib.aggregate(tower_grads, towers[0].trainable, aggregation_device)
        with tf.device(aggregation_device or home):
            if cross_process is not None:
                summed = cross_process(summed)
            summed, norm = grad_lib.clip_by_global_norm(summed, clip_norm)
        pairs = _pairs(summed, towers[0].trainable)
    job_wide = []
    if cross_process is not None:
        # The whole job's loss and metrics, equal on every process, so all make the
        # same finite-or-not decision; run in every step (below) so that every
        # process joins the same collectives in the same order.
        with tf.device(aggregation_device or home), tf.name_scope("job_wide_outputs"):
            job_wide = cross_process([loss, *metrics.values()])
        loss, metrics = job_wide[0], dict(zip(metrics, job_wide[1:], strict=True))

    # Batch-norm moving statistics are updated from tower 0 alone: every tower's
    # batch statistics estimate the same population, so one tower's suffice, and
    # N towers assigning to one variable in the same step would race, costing
    # N-1 cross-device copies for nothing (as in tf_cnn_benchmarks).
    update_ops = tf.compat.v1.get_collection(
        tf.compat.v1.GraphKeys.UPDATE_OPS, scope=towers[0].name_scope
    )

    def apply(pairs: list[tuple]) -> tf.Operation:
        apply_op = optimizer.apply_gradients(pairs, global_step)
        if replicated:
            for tower in towers[1:]:
                for slot in _slots(optimizer, tower.trainable):
                    move_to_replica_copies(slot)
        return apply_op

    all_finite = None
    if nonfinite == "apply":
        train_op = tf.group(apply(pairs), *update_ops, name="train_op")
    else:
        with tf.device(norm.device), tf.name_scope("check_finite"):
            all_finite = tf.logical_and(tf.math.is_finite(loss), tf.math.is_finite(norm))
    if nonfinite == "raise":
        checks = _check_numerics(loss, norm)
        checked = [(_after(checks, g), v) for g, v in pairs]
        with tf.control_dependencies(checks):
            updates = [_reissue(op) for op in update_ops]
        train_op = tf.group(apply(checked), *updates, name="train_op")
    elif nonfinite == "skip":
        train_op, all_finite = _apply_if_finite_or_skip(
            all_finite, lambda: [apply(pairs), *map(_reissue, update_ops)], global_step
        )
    if job_wide:
        train_op = tf.group(train_op, *job_wide, name="train_op_and_job_wide_outputs")
    # After the update is built: its optimizer slots have copies to sync too.
    sync_op = _sync_replicas(towers, optimizer) if replicated else tf.no_op(name="sync_replicas")
    return TrainOps(train_op, loss, metrics, global_step, norm, sync_op, all_finite)


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


def _clip_replicated(towers, reduced, clip_norm) -> tuple[list[tuple], tf.Tensor]:
    """(gradient, variable) pairs over every tower's copies, and tower 0's global norm.

    One apply_gradients call takes all the pairs, not one call per tower:
    optimizers with per-step state outside the slots (Adam's beta powers) must
    advance it once per step.
    """
    pairs, norms = [], []
    for tower, grads in zip(towers, reduced, strict=True):
        # Each tower clips its own copy on its own device; the inputs are
        # identical, so the results are too, with no cross-device wait.
        with tf.device(tower.device):
            clipped, norm = grad_lib.clip_by_global_norm(grads, clip_norm)
        pairs.extend(_pairs(clipped, tower.trainable))
        norms.append(norm)
    return pairs, norms[0]


def _check_numerics(loss: tf.Tensor, norm: tf.Tensor) -> list[tf.Operation]:
    """Ops failing with InvalidArgumentError when the loss or gradient norm is not finite.

    They gate the gradients (not the apply call), so ops that apply_gradients
    creates for other purposes (a SyncReplicasOptimizer's token queue and its
    initialisation) do not wait for a training step.
    """
    with tf.device(norm.device), tf.name_scope("check_finite"):
        return [
            tf.debugging.check_numerics(loss, NONFINITE_LOSS).op,
            tf.debugging.check_numerics(norm, NONFINITE_GRADIENT).op,
        ]


def _apply_if_finite_or_skip(
    all_finite: tf.Tensor, updates: Callable[[], list[tf.Operation]], global_step: tf.Variable
) -> tuple[tf.Operation, tf.Tensor]:
    """tf.cond: the updates when all_finite, else only the global-step increment.

    updates builds the apply op and tower 0's UPDATE_OPS issued again: the
    originals were built in the towers, outside the cond, and would always run.
    Returns the train op and a bool scalar, whether the update was applied.
    """

    def update() -> tf.Tensor:
        with tf.control_dependencies(updates()):
            return tf.constant(True)

    def skip() -> tf.Tensor:
        with tf.control_dependencies([global_step.assign_add(1)]):
            return tf.constant(False)

    applied = tf.compat.v1.cond(all_finite, update, skip, name="apply_if_finite")
    return tf.group(applied, name="train_op"), applied


def _after(checks: list[tf.Operation], grad):
    """grad (a tensor or IndexedSlices) as a value that exists only once checks pass."""
    with tf.control_dependencies(checks):
        if isinstance(grad, tf.IndexedSlices):
            return tf.IndexedSlices(tf.identity(grad.values), grad.indices, grad.dense_shape)
        return tf.identity(grad)


def _reissue(update) -> tf.Operation:
    """A new op doing what `update` does (same type and inputs), made in the current context.

    For the variable assignments a model adds to UPDATE_OPS (an op, or what
    `assign` returns); anything else is refused rather than guessed at.
    """
    op = update if isinstance(update, tf.Operation) else update.op
    make = getattr(tf.raw_ops, op.type, None)
    args = op.op_def.input_arg
    if make is None or any(a.number_attr or a.type_list_attr for a in args):
        raise ValueError(
            f"cannot guard update op {op.name} ({op.type}) against non-finite steps; "
            "UPDATE_OPS must be variable assignments"
        )
    made = make(**{a.name: t for a, t in zip(args, op.inputs, strict=True)})
    return made if isinstance(made, tf.Operation) else made.op


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
