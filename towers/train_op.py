"""build_train_op: split the batch, build the towers, combine their gradients, apply one update."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import NamedTuple

import tensorflow as tf

from towers import averages as averages_lib
from towers import batch_stats, state_updates
from towers import nonfinite as nonfinite_lib
from towers import precision as precision_lib
from towers.accumulate import build_step
from towers.batch_stats import CrossTowerSums
from towers.builder import Tower, build_towers
from towers.context import Features, ModelFn, TowerOutputs
from towers.placement import DeviceFn, device_checks
from towers.precision import Precision
from towers.split import split_padded
from towers.variable_update import VariableUpdate, resolve_variable_update


class TrainOps(NamedTuple):
    """What the caller runs and watches.

    train_op: one step: the update, the global-step increment and the step's state
        updates, which see the weights before the update (towers.state_updates: tower
        0's batch-norm moving statistics, whatever else its model function added to
        UPDATE_OPS or left for nothing to run, and the weight averages).
    loss: scalar, the example-weighted mean loss over the global batch.
    metrics: scalars, each the example-weighted mean of the towers' metric.
    global_step: the int64 step variable.
    step_started: int64 scalar, the global step as this step began: read before
        anything the step runs can increment it. Fetch this, not global_step, to
        number the step: a fetched variable is read at any moment of the step,
        after its increment in a few steps of a thousand.
    gradient_norm: scalar, global norm of the combined gradient before clipping.
    sync_op: copies tower 0's variables (and optimizer slots) into the other
        towers' copies; run it after initialising or restoring. A no-op where
        only one copy exists.
    init_op: initialises every global and local variable built so far, and starts
        the other towers' copies equal to tower 0's: the one op a fresh start needs.
    all_finite: bool scalar, whether the step's loss and gradient norm were
        finite (so the update was applied); None with nonfinite="apply" (and no
        loss scale).
    loss_scale: float32 scalar, the loss scale this step used (mixed_float16); None
        without loss scaling.
    overflow: bool scalar, whether this step was skipped because its float16
        gradients overflowed (not a non-finite step: the scale shrinks and training
        goes on); None without loss scaling.
    tower_outputs: the TowerOutputs each tower's model function returned (its loss
        and metrics over its own shard, its predictions), float32, one per tower in
        the order of their shards in the global batch: tower i at i; with
        accumulate_steps k, micro-batch m's tower i at m * N + i.
    synchronized_statistics: how many batch norms of a tower computed their statistics
        across the towers (and processes) in a step's micro-batch; 0 where nothing
        was synchronized (a single tower of a single process normalizes by its whole
        batch with none).
    """

    train_op: tf.Operation
    loss: tf.Tensor
    metrics: dict[str, tf.Tensor]
    global_step: tf.Variable
    gradient_norm: tf.Tensor
    sync_op: tf.Operation
    init_op: tf.Operation
    all_finite: tf.Tensor | None = None
    loss_scale: tf.Tensor | None = None
    overflow: tf.Tensor | None = None
    tower_outputs: tuple[TowerOutputs, ...] = ()
    synchronized_statistics: int = 0
    step_started: tf.Tensor | None = None


class EvalOps(NamedTuple):
    """loss and metrics: scalars, example-weighted means over the batch's B examples.
    predictions: the towers' predictions concatenated, [B, ...] in the batch's order;
    None unless every tower returned some.
    num_examples: int32 scalar, B: what the batch's loss and metrics weigh when batches
    of different sizes (a last, partial one) are averaged together."""

    loss: tf.Tensor
    metrics: dict[str, tf.Tensor]
    predictions: tf.Tensor | None = None
    num_examples: tf.Tensor | None = None


def build_train_op(
    model_fn: ModelFn,
    features: Features,
    labels: tf.Tensor,
    optimizer: tf.compat.v1.train.Optimizer,
    devices: Sequence[str],
    *,
    variable_update: str | VariableUpdate = "parameter_server",
    param_device: str | DeviceFn = "/cpu:0",
    clip_norm: float | None = None,
    global_step: tf.Variable | None = None,
    nonfinite: str = "apply",
    precision: str | Precision = "float32",
    accumulate_steps: int = 1,
    xla: bool = False,
    batch_norm: str = "local",
    positions: tf.Tensor | None = None,
    seed: int = 0,
    moving_average_decay: float | None = None,
) -> TrainOps:
    """Build a data-parallel training step over `devices`.

    features: a tensor or dict of tensors, leading dimension the global batch B.
    labels: [B, ...]. Each of the N devices gets B/N examples (sizes differ by
    at most one); the update equals a single-device step on the whole batch, except
    where the model's statistics are the shard's by definition (batch norm under
    batch_norm="local", the default: each tower normalizes by its own examples).
    variable_update: "parameter_server", "replicated", or a VariableUpdate object
        (towers.ParameterServer, towers.Replicated, towers.CrossProcess).
    param_device: with "parameter_server", where the variables live: a device
        string, "least_loaded" (spread over `devices` by byte size), or a device
        function of the variable op.
    global_step: the step variable to increment; None makes one where the mode keeps
        it (VariableUpdate.step_device).
    nonfinite: one of NONFINITE_POLICIES (towers.nonfinite): "raise" and "skip"
        check the combined loss and gradient norm before anything is updated.
    precision: "float32", "mixed_bfloat16", "mixed_float16" (with dynamic loss
        scaling), or a towers.Precision (which also sets the gradients' transfer type
        and the loss scale); see towers.precision.
    accumulate_steps: k > 1 runs the global batch as k micro-batches, one after the
        other, summing their gradients into one update (towers.accumulate); B must
        be at least k * N.
    xla: compile each tower (forward and backward) with XLA.
    batch_norm: "local" (each tower normalizes by its own shard's statistics) or
        "sync" (by the whole global batch's, across the towers and, in a CrossProcess
        mode with `sum_across_processes`, the processes; towers.batch_stats).
    positions: int64 [B], each example's position in the data (a number no other
        example of the run shares: its index in the epochs laid end to end), split
        with the batch; each tower's context then draws its examples' randomness from
        (seed, position) (TowerContext.draws: the built-in dropout), so N towers, and
        processes given their part of a global batch with its positions, draw what one
        device draws for the whole batch. None: the model draws as it likes.
    seed: the seed of those draws.
    moving_average_decay: keep an exponential moving average of each trainable variable
        with this decay, beside it and in checkpoints (towers.averages; restore a model
        from them with towers.average_names); None: none.
    """
    devices = _check_devices(devices)
    _check_optimizer(optimizer)
    if clip_norm is not None and clip_norm <= 0:
        raise ValueError(f"clip_norm must be positive, got {clip_norm}")
    nonfinite_lib.check_policy(nonfinite)
    averages_lib.check_decay(moving_average_decay)
    device_checks(devices)
    policy = precision_lib.resolve(precision)
    mode = resolve_variable_update(variable_update, param_device, devices)
    home = mode.home(devices)
    if global_step is None:
        with tf.compat.v1.device(mode.step_device(devices)):
            global_step = tf.compat.v1.train.get_or_create_global_step()
    scaler = policy.loss_scaler(home)

    sums: list[CrossTowerSums] = []
    step = build_step(model_fn, features, labels, devices, mode.variables, home,
                      micro_batches=accumulate_steps, precision=policy, scaler=scaler, xla=xla,
                      batch_sums=_batch_sums(batch_norm, devices, mode, sums),
                      positions=positions, seed=seed)
    _warn_unsynchronized(batch_norm, sums)
    towers = step.towers
    pairs, norm = mode.combine_gradients(towers, step.gradients, clip_norm)
    started, pairs, norm = _read_step_first(global_step, pairs, norm)
    loss, metrics = _combine_outputs(step.built, step.weights, home)
    loss, metrics, every_step = mode.combine_outputs(loss, metrics, home)

    # Batch-norm moving statistics are updated from tower 0 alone: every tower's
    # batch statistics estimate the same population, so one tower's suffice, and
    # N towers assigning to one variable in the same step would race, costing
    # N-1 cross-device copies for nothing (as in tf_cnn_benchmarks).
    updates = list(towers[0].state_updates)
    if moving_average_decay is not None:
        with tf.name_scope("weight_averages"):
            updates += averages_lib.averaging(moving_average_decay, towers[0].trainable,
                                              global_step)
    guarded = nonfinite_lib.guarded_update(
        nonfinite,
        lambda checked: mode.apply(optimizer, checked, global_step, towers),
        pairs, updates, loss, norm, global_step, scaler,
    )
    train_op = guarded.train_op
    if every_step:
        train_op = tf.group(train_op, *every_step, name="train_op_and_job_wide_outputs")
    # After the update is built: its optimizer slots have copies to sync too.
    sync_op = mode.sync_op(towers, optimizer)
    return TrainOps(train_op, loss, metrics, global_step, norm, sync_op,
                    mode.init_op(towers, optimizer), guarded.applied,
                    scaler.value if scaler else None, guarded.overflow,
                    tuple(t.outputs for t in step.built), sums[0].statistics if sums else 0,
                    started)


def _read_step_first(global_step: tf.Variable, pairs: list[tuple], norm: tf.Tensor
                     ) -> tuple[tf.Tensor, list[tuple], tf.Tensor]:
    """A read of the global step, and the combined gradients and their norm (scalar) as
    values that exist only after it. Every increment of the step waits on them: the
    apply's, and the skip's under nonfinite="skip", whose condition is the norm's."""
    with tf.name_scope("step_started"):
        started = tf.identity(global_step.read_value())
    return started, state_updates.first([started.op], pairs), \
        state_updates.after([started.op], norm)


def build_eval_ops(
    model_fn: ModelFn,
    features: Features,
    labels: tf.Tensor,
    devices: Sequence[str],
    param_device: str | DeviceFn = "/cpu:0",
    precision: str | Precision = "float32",
    xla: bool = False,
) -> EvalOps:
    """Evaluation towers (is_training=False) over `devices`, with the training graph's names,
    computing in `precision`'s type.

    features: a tensor or dict of tensors, leading dimension B; labels: [B, ...]. B may
    be unknown until run time and smaller than the number of towers (an evaluation's
    last batch): a tower that gets no example computes on a copy of one, weighed 0.
    """
    devices = _check_devices(devices)
    mode = resolve_variable_update("parameter_server", param_device, devices)
    home = mode.home(devices)
    with tf.name_scope("split_batch"):
        shards, counts = split_padded(features, labels, len(devices))
    towers = build_towers(model_fn, shards, devices, mode.variables, is_training=False,
                          reuse_existing=True, precision=precision_lib.resolve(precision),
                          xla=xla)
    loss, metrics = _combine_outputs(towers, _example_weights(counts, home), home)
    with tf.device(home):
        num_examples = tf.add_n(counts, name="num_examples")
    return EvalOps(loss, metrics, _concat_predictions(towers, home, num_examples), num_examples)


def _batch_sums(batch_norm: str, devices: list[str], mode: VariableUpdate,
                made: list[CrossTowerSums]) -> Callable[[], CrossTowerSums | None]:
    """What makes each micro-batch's sums across towers (each also appended to `made`):
    nothing with one tower and one process; else sums every batch norm uses ("sync"),
    or only Keras layers made with synchronized=True ("local")."""
    across = getattr(mode, "sum_across_processes", None)
    every = batch_stats.check_batch_norm(batch_norm) == "sync"
    if len(devices) == 1 and not across:
        return lambda: None

    def make() -> CrossTowerSums:
        made.append(CrossTowerSums(devices, across, every_batch_norm=every))
        return made[-1]

    return make


def _warn_unsynchronized(batch_norm: str, sums: list[CrossTowerSums]) -> None:
    """batch_norm="sync" with something to synchronize, and no statistic was: the model's
    batch norms (tf.nn.moments, a plain Keras BatchNormalization) normalize per tower."""
    if batch_norm == "sync" and sums and not any(s.used for s in sums):
        warnings.warn(
            "batch_norm='sync': the model computed no statistic across the towers, so its "
            "batch norms, if any, normalize by each tower's own shard; compute their "
            "moments with ctx.batch_moments (Keras' BatchNormalization layers are "
            "synchronized already), or pass batch_norm='local'",
            UserWarning, stacklevel=3)


def _concat_predictions(towers: list[Tower], device: str,
                        num_examples: tf.Tensor) -> tf.Tensor | None:
    """The towers' predictions along the batch axis: shards are consecutive slices, and
    the padding split_padded adds comes last, so the first num_examples rows are real."""
    predictions = [t.outputs.predictions for t in towers]
    if any(p is None for p in predictions):
        return None
    if len(predictions) == 1:
        return predictions[0]
    with tf.device(device), tf.name_scope("combine_towers"):
        return tf.identity(tf.concat(predictions, axis=0)[:num_examples], name="predictions")


def _check_devices(devices: Sequence[str]) -> list[str]:
    if isinstance(devices, int) and not isinstance(devices, bool) and devices > 0:
        raise ValueError(f"devices must be a list of device strings, one tower each; got "
                         f"{devices}: pass [f'/gpu:{{i}}' for i in range({devices})], or "
                         f"'/cpu:i' with a session made with ConfigProto(device_count="
                         f"{{'CPU': {devices}}})")
    if isinstance(devices, str) or not isinstance(devices, Sequence) or not devices:
        raise ValueError(f"devices must be a non-empty list of device strings, one tower "
                         f"each (e.g. ['/gpu:0', '/gpu:1']); got {devices!r}")
    for device in devices:
        if not isinstance(device, str):
            raise ValueError(f"devices must be device strings like '/gpu:0'; got {device!r}")
        tf.DeviceSpec.from_string(device)  # raises ValueError naming a malformed one
    return list(devices)


def _check_optimizer(optimizer) -> None:
    if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
        kind = f"{type(optimizer).__module__}.{type(optimizer).__qualname__}"
        raise ValueError(f"optimizer must be a tf.compat.v1.train.Optimizer, e.g. "
                         f"tf.compat.v1.train.MomentumOptimizer(0.1, 0.9); got {kind}; Keras "
                         f"optimizers do not build tf.compat.v1 graph updates")


def _example_weights(counts: list[tf.Tensor], device: str) -> list[tf.Tensor]:
    """Each tower's share of the batch's examples (counts: int32 scalars), float32
    scalars summing to 1."""
    with tf.device(device), tf.name_scope("example_weights"):
        counts = [tf.cast(c, tf.float32) for c in counts]
        total = tf.add_n(counts)
        return [c / total for c in counts]


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
