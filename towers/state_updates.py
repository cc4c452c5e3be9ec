"""A tower's state updates: the assignments its model makes that the step must run.

A model built on get_variable adds its state updates (batch-norm moving statistics)
to UPDATE_OPS. Keras layers make theirs (BatchNormalization's moving statistics, a
dropout SeedGenerator's state) as plain assignments that only a TF2 function's
automatic control dependencies would run: in a v1 graph nothing runs them, and a
moving mean would stay 0 for ever. So a tower's state updates are both: what its
model added to UPDATE_OPS, and every assignment to a non-trainable variable that
nothing in the tower runs. The second kind is added to UPDATE_OPS too, so a caller
reading the collection sees the same list. The step runs tower 0's
(towers.train_op), as it does the built-in batch norm's.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

import tensorflow as tf

from towers.sharing import REPLICA_COPIES

ASSIGN_OP_TYPES = frozenset({"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp"})


def of_tower(ops: list[tf.Operation]) -> list[tf.Operation]:
    """The state updates of a tower whose model made `ops`: what it added to UPDATE_OPS,
    then the assignments nothing runs (added to UPDATE_OPS here)."""
    collection = tf.compat.v1.get_collection_ref(tf.compat.v1.GraphKeys.UPDATE_OPS)
    made = set(ops)
    added = [u for u in (u if isinstance(u, tf.Operation) else u.op for u in collection)
             if u in made]
    known = set(added)
    unrun = [op for op in unrun_assignments(ops) if op not in known]
    collection.extend(unrun)
    return added + unrun


def unrun_assignments(ops: Iterable[tf.Operation]) -> list[tf.Operation]:
    """The assignments to non-trainable variables among `ops` that nothing runs.

    ops: the operations a model made while building a tower, in creation order. An
    assignment counts as unrun when nothing made in `ops` depends on it except reads
    of the value it wrote that nothing uses. A variable's own initial assignment
    (`<variable>/Assign`) is not a state update: the initialiser runs it once.
    """
    ops = list(ops)
    users: dict[tf.Operation, list[tf.Operation]] = collections.defaultdict(list)
    for op in ops:
        for source in {t.op for t in op.inputs} | set(op.control_inputs):
            users[source].append(op)
    variables = tf.compat.v1.trainable_variables() + tf.compat.v1.get_collection(REPLICA_COPIES)
    trainable = {v.handle.op for v in variables if v.trainable and hasattr(v, "handle")}
    found = []
    for op in ops:
        if (op.type not in ASSIGN_OP_TYPES or op.inputs[0].op in trainable
                or op.name.startswith(op.inputs[0].op.name + "/Assign")):
            continue
        if all(r.type == "ReadVariableOp" and not users[r] for r in users[op]):
            found.append(op)
    return found
