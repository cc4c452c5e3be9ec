"""A step's state updates: the assignments a model makes that the step must run, once.

A model's state updates come in many forms, and every one of them runs once per step:

  - what it adds to UPDATE_OPS: an assignment (the built-in batch norm's moving
    statistics), a `tf.group` of assignments, nested groups, or what
    `tf.compat.v1.train.ExponentialMovingAverage.apply` returns (a NoOp whose control
    inputs are the assignments);
  - what nothing runs: an assignment to a non-trainable variable, or a group of them,
    that nothing in the tower depends on. Keras layers make theirs this way
    (BatchNormalization's moving statistics, a dropout SeedGenerator's state: only a
    TF2 function's automatic control dependencies would run them, and in a v1 graph a
    moving mean would stay 0 for ever), and so does a bare `ema.apply(...)`. These are
    added to UPDATE_OPS too, so a caller reading the collection sees the same list.

The step runs tower 0's (of micro-batch 0): every tower's statistics estimate the same
population, and N towers assigning one variable in the same step would race.

When they run: every state update sees the weights the step's forward pass read, those
before the step's update (`first`). They are built with the forward pass, from its
values, and nothing can re-order the reads a model made inside them: an update built
after the weights change would need the model's whole read graph built again. So this
is the one order every update mode, tower count and non-finite policy can give alike.

A step that may be skipped (a non-finite policy, a loss scale) cannot hold back ops
made outside its condition: `reissue` makes each one again inside it. What the
updates are is the work they do (`work_ops`): a group's NoOp does nothing itself, and
issued again without its control inputs it would run nothing.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

import tensorflow as tf

from towers.replica_copies import REPLICA_COPIES

ASSIGN_OP_TYPES = frozenset({"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp"})
GROUP_OP_TYPES = frozenset({"NoOp"})


def of_tower(ops: list[tf.Operation]) -> list[tf.Operation]:
    """The state updates of a tower whose model made `ops`, as the ops doing their work
    (work_ops): what it added to UPDATE_OPS, then the updates nothing runs (added to
    UPDATE_OPS here)."""
    collection = tf.compat.v1.get_collection_ref(tf.compat.v1.GraphKeys.UPDATE_OPS)
    made = set(ops)
    added = [u for u in (_op_of(u) for u in _flat(collection)) if u in made]
    known = set(added)
    unrun = [op for op in unrun_updates(ops) if op not in known]
    collection.extend(unrun)
    return work_ops(added + unrun)


def unrun_updates(ops: Iterable[tf.Operation]) -> list[tf.Operation]:
    """The state updates among `ops` that nothing runs: assignments to non-trainable
    variables, and groups holding one, that nothing made in `ops` depends on except
    reads of the value written that nothing uses.

    ops: the operations a model made while building a tower, in creation order. A
    variable's own initial assignment (`<variable>/Assign`) is not a state update: the
    initialiser runs it once.
    """
    ops = list(ops)
    users: dict[tf.Operation, list[tf.Operation]] = collections.defaultdict(list)
    for op in ops:
        for source in {t.op for t in op.inputs} | set(op.control_inputs):
            users[source].append(op)
    trainable = _trainable_handles()

    def is_state_assignment(op: tf.Operation) -> bool:
        return (op.type in ASSIGN_OP_TYPES and op.inputs[0].op not in trainable
                and not op.name.startswith(op.inputs[0].op.name + "/Assign"))

    found = []
    for op in ops:
        if op.type in GROUP_OP_TYPES:
            if not users[op] and any(map(is_state_assignment, work_ops([op]))):
                found.append(op)
        elif is_state_assignment(op):
            if all(r.type == "ReadVariableOp" and not users[r] for r in users[op]):
                found.append(op)
    return found


def work_ops(updates) -> list[tf.Operation]:
    """The ops doing the work of `updates` (ops, tensors, what `assign` returns, or
    lists of them, nested), in creation order: a group's NoOp stands for its control
    inputs, followed down through nested groups."""
    found: dict[tf.Operation, None] = {}
    pending = [_op_of(u) for u in _flat(updates)]
    while pending:
        op = pending.pop()
        if op.type in GROUP_OP_TYPES:
            pending.extend(op.control_inputs)
        else:
            found[op] = None
    return sorted(found, key=lambda op: op._id)  # noqa: SLF001 (creation order)


def reissue(work: list[tf.Operation]) -> list[tf.Operation]:
    """New ops doing what `work` (work_ops) does, made in the current context (inside a
    condition, after checks): same type, inputs and control inputs, except that a
    control input among `work` becomes its new twin.

    Anything but a single op of a fixed signature (a variable assignment, most ops) is
    refused with its name rather than guessed at."""
    twins: dict[tf.Operation, tf.Operation] = {}
    for op in work:
        make = getattr(tf.raw_ops, op.type, None)
        args = op.op_def.input_arg
        if make is None or any(a.number_attr or a.type_list_attr for a in args):
            raise ValueError(
                f"cannot hold back the state update {op.name} ({op.type}) for a step that "
                f"may not be applied (a non-finite policy or a loss scale): a model's state "
                f"updates must be variable assignments, or groups of them")
        controls = [twins.get(c, c) for c in op.control_inputs]
        with tf.control_dependencies(controls):
            made = make(**{a.name: t for a, t in zip(args, op.inputs, strict=True)})
        twins[op] = made if isinstance(made, tf.Operation) else made.op
    return [twins[op] for op in work]


def first(ops: list[tf.Operation], pairs: list[tuple]) -> list[tuple]:
    """(gradient, variable) pairs whose gradients exist only once `ops` (the state
    updates, and any checks) have run, so an update applied from them changes no
    weight a state update still reads."""
    if not ops:
        return pairs
    if len(ops) > 1:
        # One op that runs after all of `ops`, for every gradient to wait on: waiting on
        # each of them would be gradients x ops control edges (resnet20: 59 x 40), which
        # every new run's graph optimisation and every step's executor walk.
        with tf.control_dependencies(ops):
            ops = [tf.no_op(name="state_updates_done")]
    return [(after(ops, g), v) for g, v in pairs]


def after(ops: list[tf.Operation], grad):
    """grad (a tensor or IndexedSlices) as a value, on its own device, that exists only
    once `ops` have run."""
    with tf.device(grad.device), tf.control_dependencies(ops):
        if isinstance(grad, tf.IndexedSlices):
            return tf.IndexedSlices(tf.identity(grad.values), grad.indices, grad.dense_shape)
        return tf.identity(grad)


def _trainable_handles() -> set[tf.Operation]:
    variables = tf.compat.v1.trainable_variables() + tf.compat.v1.get_collection(REPLICA_COPIES)
    return {v.handle.op for v in variables if v.trainable and hasattr(v, "handle")}


def _flat(updates) -> list:
    if isinstance(updates, (list, tuple)):
        return [u for item in updates for u in _flat(item)]
    return [updates]


def _op_of(update) -> tf.Operation:
    return update if isinstance(update, tf.Operation) else update.op
