"""What a step with a non-finite loss or gradient does: apply it, raise, or skip it.

  apply  no check: the update is applied whatever its values
  raise  the step fails with InvalidArgumentError (naming NONFINITE_LOSS or
         NONFINITE_GRADIENT) before any variable or batch-norm statistic changes
  skip   the update is dropped (variables, optimizer slots and batch-norm statistics
         stay as they were) and the global step still advances, as Keras'
         LossScaleOptimizer does on overflow

The gradient is judged by its global norm: non-finite when any element is.

With a loss scale (mixed_float16), a non-finite gradient with a finite loss is an
overflow the scale can cure: whatever the policy, that step is skipped (the global
step advances) and the scale shrinks; it is not a non-finite step. Only a non-finite
loss, or a non-finite gradient at the smallest scale, is one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import tensorflow as tf

from towers import state_updates
from towers.loss_scale import LossScaler

NONFINITE_POLICIES = ("apply", "raise", "skip")
NONFINITE_LOSS = "non-finite loss"  # in the InvalidArgumentError of the "raise" policy
NONFINITE_GRADIENT = "non-finite gradient"

# Builds the optimizer update from (gradient, variable) pairs.
ApplyFn = Callable[[list[tuple]], tf.Operation]


def check_policy(policy: str) -> None:
    if policy not in NONFINITE_POLICIES:
        raise ValueError(
            f"nonfinite must be one of {', '.join(NONFINITE_POLICIES)}; got {policy!r}"
        )


class Guarded(NamedTuple):
    """train_op: the step. applied: bool scalar, whether the update was applied (None
    with "apply" and no loss scale). overflow: bool scalar, whether the step was skipped
    for a loss-scale overflow (None without a loss scale)."""

    train_op: tf.Operation
    applied: tf.Tensor | None = None
    overflow: tf.Tensor | None = None


def guarded_update(
    policy: str,
    apply: ApplyFn,
    pairs: list[tuple],
    update_ops: list[tf.Operation],
    loss: tf.Tensor,
    norm: tf.Tensor,
    global_step: tf.Variable,
    scaler: LossScaler | None = None,
) -> Guarded:
    """The train op under `policy` (and the loss scale, if any).

    update_ops: the step's state updates (towers.state_updates.work_ops of tower 0's),
    run before the update in every policy (state_updates.first), and held back with it
    under "raise" and "skip".
    """
    if scaler is not None:
        return _scaled_update(policy, apply, pairs, update_ops, loss, norm, global_step, scaler)
    if policy == "apply":
        return Guarded(tf.group(_updated(apply, pairs, update_ops), name="train_op"))
    with tf.device(norm.device), tf.name_scope("check_finite"):
        all_finite = tf.logical_and(tf.math.is_finite(loss), tf.math.is_finite(norm))
    if policy == "raise":
        checks = _check_numerics(loss, norm)
        with tf.control_dependencies(checks):
            updates = state_updates.reissue(update_ops)
        step = _updated(apply, pairs, updates, checks)
        return Guarded(tf.group(step, name="train_op"), all_finite)
    return Guarded(*_apply_if_finite_or_skip(
        all_finite, lambda: _updated(apply, pairs, state_updates.reissue(update_ops)),
        global_step))


def _scaled_update(policy, apply, pairs, update_ops, loss, norm, global_step,
                   scaler: LossScaler) -> Guarded:
    """Applied only when finite, whatever the policy: an overflow must be skipped. Under
    "raise", a non-finite loss, or gradient that is no overflow, fails the step first."""
    with tf.device(norm.device), tf.name_scope("check_finite"):
        loss_finite, gradient_finite = tf.math.is_finite(loss), tf.math.is_finite(norm)
        finite = tf.logical_and(loss_finite, gradient_finite)
        overflow = scaler.overflow(loss_finite, gradient_finite)
        if policy == "raise":
            not_overflow = tf.where(overflow, tf.zeros_like(norm), norm)
            with tf.control_dependencies(_check_numerics(loss, not_overflow)):
                finite = tf.identity(finite)
    step, applied = _apply_if_finite_or_skip(
        finite, lambda: _updated(apply, pairs, state_updates.reissue(update_ops)),
        global_step)
    train_op = tf.group(step, scaler.update(finite), name="train_op_and_loss_scale")
    return Guarded(train_op, applied, overflow)


def _updated(apply: ApplyFn, pairs: list[tuple], updates: list[tf.Operation],
             checks: list[tf.Operation] = ()) -> list[tf.Operation]:
    """The update and the state updates, these first (towers.state_updates); the update
    also after `checks`. The gradients wait, not the apply call, so ops that
    apply_gradients makes for other purposes (a SyncReplicasOptimizer's token queue and
    its initialisation) do not wait for a training step."""
    return [apply(state_updates.first([*checks, *updates], pairs)), *updates]


def _check_numerics(loss: tf.Tensor, norm: tf.Tensor) -> list[tf.Operation]:
    """Ops failing with InvalidArgumentError when the loss or gradient norm is not
    finite; they gate the gradients (_updated)."""
    with tf.device(norm.device), tf.name_scope("check_finite"):
        return [
            tf.debugging.check_numerics(loss, NONFINITE_LOSS).op,
            tf.debugging.check_numerics(norm, NONFINITE_GRADIENT).op,
        ]


def _apply_if_finite_or_skip(
    all_finite: tf.Tensor, updates: Callable[[], list[tf.Operation]], global_step: tf.Variable
) -> tuple[tf.Operation, tf.Tensor]:
    """tf.cond: the updates when all_finite, else only the global-step increment.

    updates builds the apply op and the step's state updates issued again: the
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
