"""Where variables and compute go: device functions for towers and parameter devices."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf

DeviceFn = Callable[[tf.Operation], str]

# Op types that own state. Only these go to the parameter device; everything a
# tower computes (including reads of the variables) stays on the tower's device.
VARIABLE_OP_TYPES = frozenset(
    {
        "Variable",
        "VariableV2",
        "VarHandleOp",
        "AutoReloadVariable",
        "MutableHashTable",
        "MutableHashTableV2",
        "MutableHashTableOfTensors",
        "MutableHashTableOfTensorsV2",
        "MutableDenseHashTable",
        "MutableDenseHashTableV2",
    }
)


def is_variable_op(op: tf.Operation) -> bool:
    return op.type in VARIABLE_OP_TYPES


def variable_bytes(op: tf.Operation) -> int:
    """Bytes a variable op will hold; unknown dimensions count as 1."""
    try:
        shape = tf.TensorShape(op.get_attr("shape"))
        dtype = tf.as_dtype(op.get_attr("dtype"))
    except ValueError:
        return 0
    dims = [d if d is not None else 1 for d in (shape.as_list() if shape.rank is not None else [])]
    return int(np.prod(dims, dtype=np.int64)) * dtype.size


class GreedyByteBalancer:
    """Assigns each variable op to the target holding the fewest bytes so far.

    A callable `op -> target index`, usable as `replica_device_setter`'s
    `ps_strategy` as well as for spreading variables over tower devices.
    Round-robin would put a large embedding and a large softmax on the same
    target as often as not; greedy by size keeps the largest loads apart.
    """

    def __init__(self, num_targets: int):
        if num_targets < 1:
            raise ValueError(f"need at least one target, got {num_targets}")
        self.loads = [0] * num_targets

    def __call__(self, op: tf.Operation) -> int:
        target = min(range(len(self.loads)), key=self.loads.__getitem__)
        self.loads[target] += variable_bytes(op)
        return target


class LeastLoaded:
    """A variable-device function that spreads variables over `devices` by byte size."""

    def __init__(self, devices: Sequence[str]):
        self.devices = list(devices)
        self._balancer = GreedyByteBalancer(len(self.devices))

    def __call__(self, op: tf.Operation) -> str:
        return self.devices[self._balancer(op)]


def least_loaded(devices: Sequence[str]) -> DeviceFn:
    """A variable-device function that spreads variables over `devices` by byte size."""
    return LeastLoaded(devices)


def tower_device_fn(compute_device: str, variable_device: str | DeviceFn) -> DeviceFn:
    """Variable ops on variable_device (a device or device function); the rest on compute_device."""

    def place(op: tf.Operation) -> str:
        if is_variable_op(op):
            return variable_device(op) if callable(variable_device) else variable_device
        return compute_device

    return place


def same_device(a: str, b: str) -> bool:
    """Whether two device strings name one device ("/cpu:0" and "/device:CPU:0" do)."""
    return tf.DeviceSpec.from_string(a) == tf.DeviceSpec.from_string(b)


def device_type(device: str) -> str:
    """'GPU' for '/gpu:1' or '/job:worker/task:0/device:GPU:1'; '' when not given."""
    return (tf.DeviceSpec.from_string(device).device_type or "").upper()


def host_cpu(device: str) -> str:
    """The CPU of the host (task) `device` is on: '/gpu:1' gives '/device:CPU:0',
    '/job:worker/task:1/gpu:0' gives '/job:worker/task:1/device:CPU:0'."""
    spec = tf.DeviceSpec.from_string(device).replace(device_type="CPU", device_index=0)
    return spec.to_string()


def device_checks(devices: Sequence[str]) -> None:
    """A no-op on each tower CPU device beyond /cpu:0 of this process (no job named),
    named for what makes the device exist: a session sees /cpu:1 only when its config
    asks for it (ConfigProto(device_count={"CPU": n})). Made before any tower op, it is
    the first op TensorFlow's placer fails to place in a session without that config,
    so its "Cannot assign a device for operation ..." names the fix; never run."""
    cpus = [spec for spec in map(tf.DeviceSpec.from_string, devices)
            if spec.job is None and (spec.device_type or "").upper() == "CPU"
            and (spec.device_index or 0) > 0]
    if not cpus:
        return
    count = max(spec.device_index for spec in cpus) + 1
    for spec in cpus:
        with tf.device(spec), tf.control_dependencies(None):
            tf.no_op(name=f"towers_devices/CPU_{spec.device_index}_exists_only_in_a_session_"
                          f"made_with_ConfigProto_device_count_CPU_{count}")
