"""Out of memory: one line saying which device ran out, at what batch per tower, and what
to do; exit status 5 (launch.errors.OutOfMemory).

TensorFlow refuses an allocation a device cannot hold with a ResourceExhaustedError whose
message names the tensor and the device ("OOM when allocating tensor with shape[...] and
type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator ..."), followed by
the allocator's state and a stack trace: useful to TensorFlow's developers, not to the
user, who needs the device, the batch and the two settings that fix it.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Callable, Iterator

import tensorflow as tf

from launch.errors import OutOfMemory

_REFUSED = "OOM when allocating"  # TensorFlow's words for an allocation refused
_OOM = re.compile(_REFUSED + r" tensor with shape\[([\d,\s]*)\] and type (\w+) "
                  r"on (\S+) by allocator")
_LOCAL = "/job:localhost/replica:0/task:0/device:"


def tower_batch(process_batch: int, towers: int, micro_batches: int = 1) -> int:
    """The most examples one tower computes on at once: this process's share of the
    global batch, one micro-batch of it, split across its towers (the larger shards)."""
    return math.ceil(process_batch / micro_batches / towers)


@contextlib.contextmanager
def out_of_memory(where: str, fix: str,
                  latest: Callable[[], str] | None = None) -> Iterator[None]:
    """Turn TensorFlow's out-of-memory error raised in the block into OutOfMemory.

    where: what the devices were computing on ('at 256 examples per tower (...)').
    fix: the settings to change. latest: what remains saved, asked when it happens.
    """
    try:
        yield
    except tf.errors.ResourceExhaustedError as err:
        # Only an allocation refused is memory: a full disk or a full queue is also
        # RESOURCE_EXHAUSTED (and a path or a node name may hold the letters "OOM").
        if _REFUSED not in err.message:
            raise
        said = f"out of memory {_allocation(err.message)} {where}; {fix}"
        raise OutOfMemory(f"{said}. {latest()}" if latest else said) from None


def _allocation(message: str) -> str:
    """'on CPU:0 (a float tensor of shape [50000000, 256], 47.7 GiB, did not fit)'."""
    found = _OOM.search(message)
    if found is None:
        return "on a device"
    shape = [int(d) for d in found.group(1).replace(" ", "").split(",") if d]
    dtype = found.group(2)
    device = found.group(3).replace(_LOCAL, "")
    size = math.prod(shape) * _BYTES.get(dtype, 4)
    return (f"on {device} (a {dtype} tensor of shape {shape}, {_gib(size)}, did not fit)")


_BYTES = {"float": 4, "half": 2, "bfloat16": 2, "double": 8, "int32": 4, "int64": 8,
          "uint8": 1, "int8": 1, "bool": 1}


def _gib(size: int) -> str:
    return f"{size / 2**30:,.1f} GiB" if size >= 2**30 else f"{size / 2**20:,.1f} MiB"
