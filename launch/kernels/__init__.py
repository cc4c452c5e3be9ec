"""A model's kernels timed alone: the one place towers times convolutions and matrix
products in float32 against a 16-bit type.

  found    the kernels a step runs (Kernel: op type, shapes, attributes; forward or
           gradient), read from the built graph
  timing   KernelTimer: each kernel built alone in each number type, timed in
           interleaved blocks; speedup(): the kernels' combined 16-bit speed-up, the
           ceiling of a 16-bit step
  probe    the start-up probe of a 16-bit job on CPU towers, cached per machine and
           TensorFlow version; the warning when its kernels run slower than float32

`towers bench` shows each 16-bit row's ceiling with KernelTimer (timed between its
rounds, like the peak matmul); training's start-up line comes from startup_note.
"""

from __future__ import annotations

from collections.abc import Sequence

from launch.kernels.found import FORWARD, GRADIENT, Kernel, kernels_of
from launch.kernels.probe import (
    PROBE_SECONDS,
    Probe,
    cache_file,
    cached,
    precision_note,
    probe,
)
from launch.kernels.timing import KernelTimer, Timings, float32_seconds, speedup

__all__ = [
    "FORWARD",
    "GRADIENT",
    "PROBE_SECONDS",
    "Kernel",
    "KernelTimer",
    "Probe",
    "Timings",
    "cache_file",
    "cached_speedup",
    "float32_seconds",
    "kernels_of",
    "ops_run_by",
    "precision_note",
    "probe",
    "speedup",
    "startup_note",
]

_NUMBER_TYPES = {"mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}


def ops_run_by(target) -> list:
    """Every op a run of `target` (a tf.Operation) needs: its data and control inputs,
    transitively, itself included."""
    seen = {target.name: target}
    todo = [target]
    while todo:
        current = todo.pop()
        for parent in [t.op for t in current.inputs] + list(current.control_inputs):
            if parent.name not in seen:
                seen[parent.name] = parent
                todo.append(parent)
    return list(seen.values())


def startup_note(train_op, precision: str, devices: Sequence[str], tower_batch: int,
                 cache_dir: str | None = None) -> str | None:
    """The start-up warning of a job training `train_op` in `precision` on `devices`
    (tower_batch: examples per tower, for a graph built for any batch size): None for
    float32, for towers on no CPU device (a GPU's 16-bit units are what it is for), and
    when the probe finds the model's kernels faster in 16 bits."""
    from towers import device_type  # imports TensorFlow

    number_type = _NUMBER_TYPES.get(precision)
    if number_type is None or not any(device_type(d) == "CPU" for d in devices):
        return None
    counts = kernels_of(ops_run_by(train_op), tower_batch)
    if not counts:
        return None
    note = precision_note(precision, probe(counts, number_type, cache_dir=cache_dir))
    from launch.devices import NATIVE_FLAGS, native_flags  # imports TensorFlow

    if note and not native_flags(number_type):
        note += (f"; this CPU has none of {', '.join(NATIVE_FLAGS[number_type])}, so "
                 f"TensorFlow emulates {number_type}")
    return note


def cached_speedup(train_op, number_type: str, devices: Sequence[str], tower_batch: int,
                   cache_dir: str | None = None) -> float | None:
    """The speed-up in `number_type` ('bfloat16', 'float16') of the kernels a float32
    job's `train_op` runs, as this machine's cache holds it from an earlier 16-bit
    job's start-up probe, timing nothing: None where none of them was timed, or where
    a tower is on a GPU (the probe times CPU kernels)."""
    from launch.devices import on_cpus  # imports TensorFlow

    if not on_cpus(list(devices)):
        return None
    counts = kernels_of(ops_run_by(train_op), tower_batch)
    return cached(counts, number_type, cache_dir).overall if counts else None
