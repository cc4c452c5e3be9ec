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

ReplicaCopies is in towers.replica_copies, with how its copies are kept and filled.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import tensorflow as tf

from towers.made_variables import MadeVariables
from towers.placement import DeviceFn
from towers.precision import Precision


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
