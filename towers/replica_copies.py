"""Replicated mode's variables: a copy of each trainable variable per tower.

Tower 0's variables are the ones under the plain names (the ones checkpoints hold);
tower i's copies are named `tower_i/<name>`, live on tower i's device, and are kept in
REPLICA_COPIES: outside GLOBAL_VARIABLES, so checkpoints hold one set, and outside
LOCAL_VARIABLES, so no initializer races the sync op that fills them. The optimizer's
slots of a copy are copies too, and its regularization penalties are kept per tower
(REPLICA_PENALTIES), outside REGULARIZATION_LOSSES.

The sync op copies tower 0's variables and slots into every copy, then sets a flag;
each later tower's first op checks it, so a forgotten sync is a clear error rather
than TensorFlow's "Could not find variable tower_1/...". The init op (a fresh start)
sets the same flag after assigning each copy its source's initial value.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import tensorflow as tf

from towers.context import own_collection
from towers.placement import host_cpu
from towers.sharing import VariableSharing

# Graph collection holding the per-tower copies made in replicated mode (and their
# optimizer slots).
REPLICA_COPIES = "towers_replica_copies"
# Graph collections (one per later tower, "<this>/tower_i") of the regularization
# penalties of tower i's copies.
REPLICA_PENALTIES = "towers_replica_penalties"
# Graph collection of the flag the replicated sync op sets, and later towers check.
SYNCED_FLAG = "towers_replicas_synced"


class ReplicaCopies(VariableSharing):
    """A copy of each trainable variable per tower, on the tower's device.

    Tower 0's copies are the variables under the plain names (the ones checkpoints
    hold); tower i's are named `tower_i/<name>` and kept in REPLICA_COPIES.
    """

    def device(self, tower_device: str) -> str:
        return tower_device

    def first_name(self, index: int, name: str) -> str:
        """A name made from one of tower i's copies (`tower_i/w/ExponentialMovingAverage`,
        the shadow an ExponentialMovingAverage in the model makes for the copy of `w`)
        is tower 0's made from the original: tower 0's state is the one kept."""
        prefix = f"tower_{index}/"
        return name[len(prefix):] if name.startswith(prefix) else name

    def later_variable(self, getter, index, original, name, *args, **kwargs):
        if not original.trainable:
            return original
        kwargs["collections"] = [REPLICA_COPIES]
        kwargs["reuse"] = tf.compat.v1.AUTO_REUSE
        copy = getter(f"tower_{index}/{name}", *args, **kwargs)
        _move_to_replica_copies(copy)
        return copy

    def later_created_variable(self, next_creator, index, original, kwargs):
        if not original.trainable:
            return original
        copy = _copy_named(next_creator, kwargs, f"tower_{index}/{original.op.name}")
        _move_to_replica_copies(copy)
        return copy

    def tower_variables(self, index, first, first_vars):
        copies = {v.op.name: v for v in tf.compat.v1.get_collection(REPLICA_COPIES)}
        name_of = {id(v): name for name, v in first_vars.items()}
        missing = [v.op.name for v in first if id(v) not in name_of]
        if missing:
            raise ValueError(
                f"replicated towers need every trainable variable made inside the model "
                f"function (with tf.compat.v1.get_variable, a Keras layer or tf.Variable); "
                f"made before the towers were built: {', '.join(missing)}"
            )
        shared = [name_of[id(v)] for v in first if f"tower_{index}/{name_of[id(v)]}" not in copies]
        if shared:
            raise ValueError(
                f"replicated towers: tower {index} read tower 0's {', '.join(shared)} instead "
                f"of making its own copy; a Keras model (or other object holding variables) "
                f"made once and called by every tower cannot have per-tower copies: make it "
                f"inside the model function, so each tower builds its own"
            )
        return [copies[f"tower_{index}/{name_of[id(v)]}"] for v in first]

    @contextlib.contextmanager
    def building_tower(self, index: int, device: str) -> Iterator[None]:
        """Later towers read their copies only once a sync op has filled them, and see
        only their own regularization losses.

        Without the check, running only the standard initializer fails the first step
        with "Could not find variable tower_1/...", naming a variable the user never
        made. Every op of the tower waits for the check, so its message comes first.
        A copy made with `get_variable(regularizer=...)` adds its own penalty to
        REGULARIZATION_LOSSES: `get_regularization_loss()` in tower i must sum those,
        not tower 0's, whose gradients would reach tower 0's variables instead. The
        copies' penalties are kept in a collection per tower (REPLICA_PENALTIES), out
        of REGULARIZATION_LOSSES: a later build of the tower (the next micro-batch,
        whose get_variable makes no penalty again) sees its tower's again, tower 0
        sees only its own, and so does anything reading the collection after the
        step (evaluation towers, a caller's get_regularization_loss()).
        """
        if index == 0:
            yield
            return
        with (
            tf.control_dependencies([_check_synced(device)]),
            own_collection(tf.compat.v1.GraphKeys.REGULARIZATION_LOSSES,
                           kept_in=f"{REPLICA_PENALTIES}/tower_{index}"),
        ):
            yield

    def adopt_slots(self, optimizer, trainables):
        """A copy's slots are copies too: out of checkpoints, filled by the sync."""
        for variables in trainables[1:]:
            for slot in _slots(optimizer, variables):
                _move_to_replica_copies(slot)

    def sync_op(self, trainables, optimizer):
        """Assign tower 0's variables and slots to every other tower's copies, then set
        the flag later towers check."""
        assigns = [_assign(copy, source.value())
                   for source, copy in _copy_pairs(trainables, optimizer)]
        return _flag_after(assigns, name="sync_replicas")

    def init_op(self, trainables, optimizer, initializers):
        """Each copy is assigned its source's initial value, the very tensor the source's
        initializer assigns in the same run, so the copies start equal to tower 0's
        whatever draws its initial values (random, or a slot's own initializer). A sync
        there instead would have to wait for the initializers to read their variables:
        a second copy of every assign in the graph, which the launcher never runs."""
        assigns = [_assign(copy, source.initial_value)
                   for source, copy in _copy_pairs(trainables, optimizer)]
        return _flag_after([*initializers, *assigns], name="init_op")


def _copy_named(next_creator, kwargs, name: str) -> tf.Variable:
    """A new variable made by `next_creator` whose op is named exactly `name`."""
    graph = tf.compat.v1.get_default_graph()
    scope, _, base = name.rpartition("/")
    with graph.name_scope(scope + "/" if scope else ""):
        var = next_creator(**{**kwargs, "name": base})
    if var.op.name != name:
        raise ValueError(
            f"cannot make variable '{name}': the graph already has an op of that name"
        )
    return var


def _check_synced(device: str) -> tf.Operation:
    flag = _synced_flag(device)
    with tf.device(flag.device), tf.name_scope("check_replicas_synced"):
        return tf.debugging.Assert(
            tf.compat.v1.is_variable_initialized(flag),
            ["replicated towers: the per-tower variable copies were never filled; run "
             "TrainOps.init_op to initialise (or TrainOps.sync_op after initialising "
             "or restoring the variables yourself) before the first step"],
            name="replicas_synced")


def _synced_flag(device: str) -> tf.Variable:
    """The graph's flag, set by the sync op; outside every standard collection, so only
    the sync op ever initialises it."""
    found = tf.compat.v1.get_collection(SYNCED_FLAG)
    if found:
        return found[0]
    # On the CPU of the first later tower's task: a bool variable needs no GPU kernel.
    with tf.device(host_cpu(device)), tf.control_dependencies(None):
        return tf.compat.v1.Variable(False, trainable=False, name="towers_replicas_synced",
                                     collections=[SYNCED_FLAG], use_resource=True)


def _move_to_replica_copies(var: tf.Variable) -> None:
    """Keep a replica's state out of checkpoints and the standard initializers.

    The collections are searched by identity: `var in collection` would call every
    variable's __eq__ (Python), for each of a replicated model's copies and slots, a
    cost that grows with the square of the model's variable count."""
    graph = var.graph
    keys = tf.compat.v1.GraphKeys
    for key in (keys.GLOBAL_VARIABLES, keys.TRAINABLE_VARIABLES):
        collection = graph.get_collection_ref(key)
        collection[:] = [v for v in collection if v is not var]
    copies = graph.get_collection_ref(REPLICA_COPIES)
    if not any(v is var for v in copies):
        copies.append(var)


def _copy_pairs(trainables: list[list[tf.Variable]], optimizer: tf.compat.v1.train.Optimizer
                ) -> list[tuple[tf.Variable, tf.Variable]]:
    """(tower 0's variable or slot, a later tower's copy of it), for every copy."""
    pairs = []
    for variables in trainables[1:]:
        for source, copy in zip(trainables[0], variables, strict=True):
            pairs.append((source, copy))
            for name in optimizer.get_slot_names():
                src, dst = optimizer.get_slot(source, name), optimizer.get_slot(copy, name)
                if src is not None and dst is not None:
                    pairs.append((src, dst))
    return pairs


def _assign(copy: tf.Variable, value: tf.Tensor) -> tf.Operation:
    with tf.device(copy.device):
        return copy.assign(value, read_value=False)


def _flag_after(ops: list[tf.Operation], name: str) -> tf.Operation:
    """`ops` grouped, then the flag later towers check set (where there is one)."""
    for flag in tf.compat.v1.get_collection(SYNCED_FLAG):
        with tf.control_dependencies(ops):
            ops = [flag.assign(True, read_value=False)]
    return tf.group(*ops, name=name)


def _slots(optimizer: tf.compat.v1.train.Optimizer, variables: list[tf.Variable]) -> list:
    found = (optimizer.get_slot(v, name) for v in variables for name in optimizer.get_slot_names())
    return [s for s in found if s is not None]
