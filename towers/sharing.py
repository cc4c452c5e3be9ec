"""How tower i gets its variables.

Tower 0 makes every variable. A later tower makes none of its own (one that does is an
error naming the variable): for each variable it asks for, it is handed what the
update mode's sharing gives for tower 0's:

  SharedVariables  tower 0's variable itself, on the parameter device (parameter_server,
                   and the cross-process mode built on it)
  ReplicaCopies    for a trainable variable, its own copy `tower_i/<name>` on the
                   tower's device (replicated); non-trainable state stays single

A model asks in two ways, and both are answered alike (TowerVariables, one per build):

  get_variable     through the variable scope's custom getter. Tower 0's records each
                   variable by name; a later tower's hands out the sharing's answer for
                   that name, and refuses a name tower 0 never made.
  Keras layers,    skip the custom getter, but every variable passes TensorFlow's
  tf.Variable      variable creator scope (towers.made_variables). Tower 0 makes each one
                   outside its `tower_0/` name scope, so checkpoints name it
                   `sequential/dense/kernel`, and remembers them in creation order; a
                   later tower's k-th creation is answered with the sharing's answer for
                   tower 0's k-th, checked by the name it was asked for (`kernel`).
                   Building the same model again makes its variables in the same order.
                   Building the towers again with the same MadeVariables (a later
                   micro-batch of an accumulating step) hands each tower what it got the
                   first time, so every micro-batch reads the same variables.

Replicated copies live in REPLICA_COPIES: outside GLOBAL_VARIABLES, so checkpoints
hold one set under the plain names, and outside LOCAL_VARIABLES, so no initializer
races the sync op that fills them. The optimizer's slots of a copy are copies too, and
its regularization penalties are kept per tower (REPLICA_PENALTIES), outside
REGULARIZATION_LOSSES.
The sync op copies tower 0's variables and slots into every copy, then sets a flag;
each later tower's first op checks it, so a forgotten sync is a clear error rather
than TensorFlow's "Could not find variable tower_1/...". The init op (a fresh start)
sets the same flag after assigning each copy its source's initial value.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import tensorflow as tf

from towers.context import own_collection
from towers.made_variables import MadeVariables
from towers.placement import DeviceFn, host_cpu
from towers.precision import Precision

# Graph collection holding the per-tower copies made in replicated mode (and their
# optimizer slots).
REPLICA_COPIES = "towers_replica_copies"
# Graph collections (one per later tower, "<this>/tower_i") of the regularization
# penalties of tower i's copies.
REPLICA_PENALTIES = "towers_replica_penalties"
# Graph collection of the flag the replicated sync op sets, and later towers check.
SYNCED_FLAG = "towers_replicas_synced"


class VariableSharing:
    """What a later tower is handed for each of tower 0's variables; here, tower 0's own."""

    def device(self, tower_device: str) -> str | DeviceFn:
        """Where the variables a tower on `tower_device` reads are placed."""
        raise NotImplementedError

    def first_name(self, index: int, name: str) -> str:
        """The name tower 0 asked for where tower `index` asks for `name`: the same."""
        return name

    def later_variable(self, getter, index: int, original: tf.Variable, name: str,
                       *args, **kwargs) -> tf.Variable:
        """What tower `index` > 0 reads when it asks get_variable for tower 0's `name`.
        `getter`, args and kwargs are what the custom getter was called with."""
        return original

    def later_created_variable(self, next_creator, index: int, original: tf.Variable,
                               kwargs: dict) -> tf.Variable:
        """What tower `index` > 0 gets when it makes, without get_variable (a Keras
        layer, tf.Variable), its counterpart of tower 0's `original`. `next_creator`
        and `kwargs` are what TensorFlow's variable creator scope was called with."""
        return original

    def tower_variables(self, index: int, first: list[tf.Variable],
                        first_vars: dict[str, tf.Variable]) -> list[tf.Variable]:
        """The trainable variables tower `index` reads, aligned with tower 0's `first`;
        `first_vars` is every variable tower 0 made, by the name it was asked for."""
        return list(first)

    @contextlib.contextmanager
    def building_tower(self, index: int, device: str) -> Iterator[None]:
        """Entered around each tower's model function (a hook for per-tower guards)."""
        yield

    def adopt_slots(self, optimizer: tf.compat.v1.train.Optimizer,
                    trainables: list[list[tf.Variable]]) -> None:
        """Once the update is built: files the optimizer's slots of each tower's
        variables (`trainables[i]`: tower i's) where they belong."""

    def sync_op(self, trainables: list[list[tf.Variable]],
                optimizer: tf.compat.v1.train.Optimizer) -> tf.Operation:
        """Makes every tower's copies (`trainables[i]`: tower i's variables) equal tower
        0's; a no-op with one copy."""
        return tf.no_op(name="sync_replicas")

    def init_op(self, trainables: list[list[tf.Variable]],
                optimizer: tf.compat.v1.train.Optimizer,
                initializers: list[tf.Operation]) -> tf.Operation:
        """Runs `initializers` (every standard variable's) and starts every copy equal to
        tower 0's: the one op a fresh start needs."""
        return tf.group(*initializers, name="init_op")


class SharedVariables(VariableSharing):
    """Every tower reads the one copy tower 0 made, on `param_device`: a device, or a
    device function of the variable op (towers.least_loaded, a replica_device_setter)."""

    def __init__(self, param_device: str | DeviceFn):
        self.param_device = param_device

    def device(self, tower_device: str) -> str | DeviceFn:
        return self.param_device


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


class TowerVariables:
    """One build of the towers' variables: what tower 0 made, what each later tower is
    handed (by `sharing`), and the trainable variables each tower reads.

    made: the creations of an earlier build of the same towers (a later micro-batch),
        handed out again; None: a new build.
    reuse_existing: tower 0 reuses variables already in the graph (evaluation beside
        training, or a later micro-batch) instead of insisting on creating them.
    """

    def __init__(self, sharing: VariableSharing, made: MadeVariables | None = None,
                 reuse_existing: bool = False):
        self.sharing = sharing
        self.made = made or MadeVariables()
        self.reuse_existing = reuse_existing
        self.first_vars: dict[str, tf.Variable] = {}  # tower 0's, by the name asked for
        self._trainable: list[list[tf.Variable]] = []  # each built tower's
        self._before: set[tf.Variable] = set()

    def variable_scope(self, index: int, precision: Precision, name_scope: str):
        """The variable scope tower `index` builds in: get_variable recorded (tower 0)
        or answered by the sharing (later towers), through the precision's casting
        getter (`name_scope`: the tower's, for the casts), default dtype its compute
        type."""
        getter = self._record if index == 0 else functools.partial(self._hand_out, index)
        return tf.compat.v1.variable_scope(
            tf.compat.v1.get_variable_scope(),
            reuse=self._reuse(index),
            custom_getter=self._passed_by_creator_scope(precision.wrap_getter(getter, name_scope)),
            dtype=precision.compute_dtype,
        )

    @contextlib.contextmanager
    def tower(self, index: int, device: str, scope: str) -> Iterator[None]:
        """Around tower `index`'s model function, inside its name scope `scope`
        ('tower_0/'): the sharing's per-tower guard, and variables made without
        get_variable handed out by creation order."""
        self._before = set(tf.compat.v1.trainable_variables())
        with (
            self.sharing.building_tower(index, device),
            self.made.tower(index, scope, self.first_vars, self.sharing),
        ):
            yield

    def trainable(self, index: int) -> list[tf.Variable]:
        """The trainable variables tower `index` reads, aligned with tower 0's; called
        once its model function has run."""
        new = [v for v in tf.compat.v1.trainable_variables() if v not in self._before]
        if index == 0:
            trainable = _unique([v for v in self.first_vars.values() if v.trainable] + new)
        else:
            _reject_new_variables(index, new)
            trainable = self.sharing.tower_variables(index, self._trainable[0], self.first_vars)
        self._trainable.append(trainable)
        return trainable

    def _reuse(self, index: int):
        if index > 0:
            return True
        if self.reuse_existing:
            return tf.compat.v1.AUTO_REUSE
        return None

    def _record(self, getter, name, *args, **kwargs):
        """Tower 0's getter: remembers every variable by name for the later towers."""
        try:
            var = getter(name, *args, **kwargs)
        except ValueError as err:
            if "already exists" not in str(err) or name in self.first_vars:
                raise  # the model function asked twice itself: TensorFlow's own message
            raise ValueError(
                f"variable {name} already exists in this graph, made before build_train_op "
                f"(by an earlier build_train_op, or outside the model function): build each "
                f"training step in a graph of its own (with tf.Graph().as_default()), or "
                f"under a tf.compat.v1.variable_scope of its own") from None
        self.first_vars[name] = var
        return var

    def _hand_out(self, index: int, getter, name, *args, **kwargs):
        """A later tower's getter: only variables tower 0 made, as the sharing hands them out."""
        name = self.sharing.first_name(index, name)
        if name not in self.first_vars:
            raise ValueError(
                f"tower {index} asked for variable '{name}', which tower 0 did not create; "
                f"a model function must create the same variables in every tower"
            )
        return self.sharing.later_variable(getter, index, self.first_vars[name], name,
                                           *args, **kwargs)

    def _passed_by_creator_scope(self, custom_getter):
        """`custom_getter`, handed a real getter whose variables the creator scope lets
        through: the custom getter has already decided what they are. (TensorFlow
        passes the real getter as the keyword argument `getter`.)"""

        def custom(getter, *args, **kwargs):
            return custom_getter(self.made.through_getter(getter), *args, **kwargs)

        return custom


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


def _reject_new_variables(index: int, new: list[tf.Variable]) -> None:
    """Catches variables made without get_variable, which bypass the reuse check."""
    if new:
        names = ", ".join(sorted(v.op.name for v in new))
        raise ValueError(
            f"tower {index} created trainable variable(s) {names} that tower 0 did not; "
            f"create variables with tf.compat.v1.get_variable so later towers reuse them"
        )


def _unique(variables: list[tf.Variable]) -> list[tf.Variable]:
    seen: set[int] = set()
    return [v for v in variables if not (id(v) in seen or seen.add(id(v)))]


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
