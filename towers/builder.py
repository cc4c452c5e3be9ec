"""Call a model function once per device: shared or replicated variables, one name scope each."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import tensorflow as tf

from towers.context import ModelFn, TowerContext, TowerOutputs, as_tower_outputs
from towers.placement import DeviceFn, tower_device_fn
from towers.split import Shard

# Graph collection holding the per-tower copies made in replicated mode. They
# live outside GLOBAL_VARIABLES so checkpoints hold one copy under the plain
# names, and outside LOCAL_VARIABLES so no initializer races the sync op that
# copies tower 0's values into them.
REPLICA_COPIES = "towers_replica_copies"


@dataclass
class Tower:
    """One built tower: its outputs and the variables its gradients are taken against."""

    index: int
    device: str
    name_scope: str
    outputs: TowerOutputs
    num_examples: tf.Tensor
    trainable: list[tf.Variable] = field(default_factory=list)


def build_towers(
    model_fn: ModelFn,
    shards: Sequence[Shard],
    devices: Sequence[str],
    variable_device: str | DeviceFn | None,
    *,
    is_training: bool,
    replicated: bool = False,
    reuse_existing: bool = False,
) -> list[Tower]:
    """Build one tower per device, all reading the same variables.

    parameter-server style (replicated=False): tower 0 creates the variables on
    variable_device; later towers reuse them and may create none of their own.
    Replicated: every tower gets its own copy of each trainable variable, on its
    own device, named `tower_i/<name>`; non-trainable state such as batch-norm
    moving averages stays single (only tower 0 updates it).
    reuse_existing: tower 0 reuses variables already in the graph (evaluation
    beside training) instead of insisting on creating them.
    """
    if len(shards) != len(devices):
        raise ValueError(f"{len(shards)} shards for {len(devices)} devices")
    towers: list[Tower] = []
    first_vars: dict[str, tf.Variable] = {}
    for i, (shard, device) in enumerate(zip(shards, devices, strict=True)):
        ctx = TowerContext(i, len(devices), device, is_training, shard.num_examples)
        var_device = device if replicated else variable_device
        getter = _record_getter(first_vars) if i == 0 else _later_getter(i, first_vars, replicated)
        trainable_before = set(tf.compat.v1.trainable_variables())
        with (
            tf.compat.v1.variable_scope(
                tf.compat.v1.get_variable_scope(),
                reuse=_reuse_mode(i, replicated, reuse_existing),
                custom_getter=getter,
            ),
            tf.compat.v1.name_scope(f"tower_{i}") as scope,
            tf.compat.v1.device(tower_device_fn(device, var_device or device)),
        ):
            outputs = as_tower_outputs(model_fn(shard.features, shard.labels, ctx))
        _check_scalar(outputs, i)
        new_trainable = [v for v in tf.compat.v1.trainable_variables() if v not in trainable_before]
        if i == 0:
            trainable = _unique([v for v in first_vars.values() if v.trainable] + new_trainable)
        else:
            _reject_new_variables(i, new_trainable)
            trainable = _tower_variables(i, towers[0].trainable, first_vars, replicated)
        towers.append(Tower(i, device, scope, outputs, shard.num_examples, trainable))
    return towers


def _reuse_mode(index: int, replicated: bool, reuse_existing: bool):
    if index > 0 and not replicated:
        return True
    if index == 0 and reuse_existing:
        return tf.compat.v1.AUTO_REUSE
    return None


def _record_getter(created: dict[str, tf.Variable]):
    """Tower 0's getter: remembers every variable by name for the later towers."""

    def record(getter, name, *args, **kwargs):
        var = getter(name, *args, **kwargs)
        created[name] = var
        return var

    return record


def _later_getter(index: int, first_vars: dict[str, tf.Variable], replicated: bool):
    """A later tower's getter: only variables tower 0 made, copied in replicated mode."""

    def reuse_or_copy(getter, name, *args, **kwargs):
        if name not in first_vars:
            raise ValueError(
                f"tower {index} asked for variable '{name}', which tower 0 did not create; "
                f"a model function must create the same variables in every tower"
            )
        original = first_vars[name]
        if not replicated or not original.trainable:
            return original
        kwargs["collections"] = [REPLICA_COPIES]
        kwargs["reuse"] = tf.compat.v1.AUTO_REUSE
        copy = getter(f"tower_{index}/{name}", *args, **kwargs)
        move_to_replica_copies(copy)
        return copy

    return reuse_or_copy


def move_to_replica_copies(var: tf.Variable) -> None:
    """Keep a replica's state out of checkpoints and the standard initializers."""
    graph = var.graph
    keys = tf.compat.v1.GraphKeys
    for key in (keys.GLOBAL_VARIABLES, keys.TRAINABLE_VARIABLES):
        collection = graph.get_collection_ref(key)
        if var in collection:
            collection.remove(var)
    if var not in graph.get_collection(REPLICA_COPIES):
        graph.add_to_collection(REPLICA_COPIES, var)


def _reject_new_variables(index: int, new: list[tf.Variable]) -> None:
    """Catches variables made without get_variable, which bypass the reuse check."""
    if new:
        names = ", ".join(sorted(v.op.name for v in new))
        raise ValueError(
            f"tower {index} created trainable variable(s) {names} that tower 0 did not; "
            f"create variables with tf.compat.v1.get_variable so later towers reuse them"
        )


def _tower_variables(
    index: int, first: list[tf.Variable], first_vars: dict[str, tf.Variable], replicated: bool
) -> list[tf.Variable]:
    """The variables tower `index` reads, in the order of tower 0's trainable list."""
    if not replicated:
        return list(first)
    copies = {v.op.name: v for v in tf.compat.v1.get_collection(REPLICA_COPIES)}
    name_of = {id(v): name for name, v in first_vars.items()}
    missing = [v.op.name for v in first if id(v) not in name_of]
    if missing:
        raise ValueError(
            f"replicated towers need every trainable variable made with "
            f"tf.compat.v1.get_variable; made otherwise: {', '.join(missing)}"
        )
    return [copies[f"tower_{index}/{name_of[id(v)]}"] for v in first]


def _unique(variables: list[tf.Variable]) -> list[tf.Variable]:
    seen: set[int] = set()
    return [v for v in variables if not (id(v) in seen or seen.add(id(v)))]


def _check_scalar(outputs: TowerOutputs, index: int) -> None:
    tensors = {"loss": outputs.loss, **{f"metrics['{k}']": v for k, v in outputs.metrics.items()}}
    for what, tensor in tensors.items():
        if tensor.shape.rank not in (0, None):
            raise ValueError(
                f"tower {index}: model_fn's {what} must be a scalar, got shape {tensor.shape}"
            )
