"""Combining tower gradients: sum on the variable's device, all-reduce, clip.

Every gradient arriving here is already scaled by its tower's share of the
global batch (examples in the tower / examples in the batch), so the combined
gradient is a plain sum and equals the gradient of the mean loss over the
whole batch, even when the towers' shards differ in size.

Gradients arrive in the type they travel in (towers.Precision.gradient_dtype:
float32, or 16 bits for half the bytes) and are cast to their variable's type,
float32, where they land, before they are summed.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from towers.packing import packed_send
from towers.placement import device_type
from towers.precision import cast_gradient

Gradient = tf.Tensor | tf.IndexedSlices | None
ALL_REDUCE = ("auto", "nccl", "copy")
# What TensorFlow's NcclAllReduce sums. Not bfloat16: those gradients take "copy".
NCCL_DTYPES = (tf.float16, tf.float32, tf.float64)


def sum_gradients(grads: Sequence[Gradient], dtype: tf.DType | None = None) -> Gradient:
    """Sum one variable's gradients from several towers, each first cast to `dtype`
    (in the current device scope, where they land) when given.

    Sparse gradients (from embedding lookups) stay sparse: their rows are
    concatenated, which the optimizers' sparse updates add up correctly.
    """
    present = [cast_gradient(g, dtype) if dtype else g for g in grads if g is not None]
    if not present:
        return None
    if len(present) == 1:
        return present[0]
    if all(isinstance(g, tf.IndexedSlices) for g in present):
        return tf.IndexedSlices(
            values=tf.concat([g.values for g in present], axis=0),
            indices=tf.concat([g.indices for g in present], axis=0),
            dense_shape=present[0].dense_shape,
        )
    return tf.add_n([tf.convert_to_tensor(g) for g in present])


def aggregate(
    tower_grads: Sequence[Sequence[Gradient]],
    variables: Sequence[tf.Variable],
    device: str | None = None,
) -> list[Gradient]:
    """Sum each variable's tower gradients, on `device` or else where the variable lives.

    tower_grads[i][j] is tower i's (weighted) gradient for variables[j]. Summing
    where the variable lives sends each tower's gradient across once and keeps
    the update local (tf_cnn_benchmarks calls this aggregation with variable
    colocation). A worker whose variables live on remote ps tasks sums on its
    own device instead, so one gradient per variable crosses the network.
    """
    summed = []
    for j, var in enumerate(variables):
        with tf.device(device or var.device), tf.name_scope("aggregate"):
            summed.append(sum_gradients([grads[j] for grads in tower_grads],
                                        var.dtype.base_dtype))
    return summed


def send_to_variables(grads: Sequence[Gradient], variables: Sequence[tf.Variable],
                      wire: tf.DType, source: str, pack_bytes: int = 0) -> list[Gradient]:
    """Gradients summed on `source`, sent to their variables' devices in `wire` and cast
    back to the variable's type there (a worker's summed gradients on their way to the
    ps tasks). pack_bytes > 0: packed per destination in buffers of at most that many
    bytes (towers.packing.packed_send); 0, and `wire` already their type: as they are."""
    with tf.device(source), tf.name_scope("send"):
        sent = [cast_gradient(grad, wire) for grad in grads]
    moved = packed_send(sent, variables, source, pack_bytes)
    out = []
    for grad, var in zip(moved, variables, strict=True):
        with tf.device(var.device), tf.name_scope("receive"):
            out.append(cast_gradient(grad, var.dtype.base_dtype))
    return out


def all_reduce_method(devices: Sequence[str], built_with_cuda: bool | None = None) -> str:
    """"nccl" where every device is a GPU and TensorFlow was built with CUDA (NCCL's
    kernels exist only then), else "copy". built_with_cuda: None asks TensorFlow; a test
    may say what a CUDA build would choose."""
    if built_with_cuda is None:
        built_with_cuda = _nccl_available()
    gpus = all(device_type(d) == "GPU" for d in devices)
    return "nccl" if built_with_cuda and gpus else "copy"


def all_reduce(tower_grads: Sequence[Sequence[Gradient]], devices: Sequence[str],
               dtypes: Sequence[tf.DType], method: str = "auto") -> list[list]:
    """Sum gradients across towers and give every tower the same result on its device.

    Returns out[i][j]: the total gradient of variable j, of type dtypes[j], placed
    on devices[i]. method "nccl": NCCL's all-sum for dense gradients (summed in the
    type they travel in); "copy": a sum on one device (in dtypes[j]) sent back to
    every device in the type the gradients came in, which leaves every tower with
    bit-identical values (so the copies stay equal); "auto": all_reduce_method's
    choice. Sparse gradients, and bfloat16 ones (NCCL has no bfloat16 sum), always
    take "copy"; sparse ones stay sparse: densifying them would change what sparse
    optimizer updates do (momentum, for one, touches only the rows present).
    """
    if method not in ALL_REDUCE:
        raise ValueError(f"all_reduce must be one of {', '.join(ALL_REDUCE)}; got {method!r}")
    if method == "auto":
        method = all_reduce_method(devices)
    num_vars = len(tower_grads[0])
    out: list[list] = [[None] * num_vars for _ in devices]
    for j in range(num_vars):
        grads = [g[j] for g in tower_grads]
        if any(g is None for g in grads):
            continue
        wire = grads[0].dtype
        dense = not any(isinstance(g, tf.IndexedSlices) for g in grads)
        if method == "nccl" and dense and wire in NCCL_DTYPES:
            from tensorflow.python.ops import nccl_ops

            totals = nccl_ops.all_sum(grads)
        else:
            # Spread the summing work over the devices, one variable each in turn.
            with tf.device(devices[j % len(devices)]), tf.name_scope("all_reduce"):
                total = cast_gradient(sum_gradients(grads, dtypes[j]), wire)
            totals = [_copy_to(total, device) for device in devices]
        for i, (total, device) in enumerate(zip(totals, devices, strict=True)):
            with tf.device(device):
                out[i][j] = cast_gradient(total, dtypes[j])
    return out


def _copy_to(grad: tf.Tensor | tf.IndexedSlices, device: str) -> tf.Tensor | tf.IndexedSlices:
    with tf.device(device):
        if isinstance(grad, tf.IndexedSlices):
            return tf.IndexedSlices(
                tf.identity(grad.values), tf.identity(grad.indices), grad.dense_shape
            )
        return tf.identity(grad)


def clip_by_global_norm(
    grads: Sequence[Gradient], clip_norm: float | None
) -> tuple[list[Gradient], tf.Tensor]:
    """Clip to clip_norm if given; always return the global norm before clipping (a scalar)."""
    present = [g for g in grads if g is not None]
    norm = tf.linalg.global_norm(present)
    if clip_norm is None:
        return list(grads), norm
    clipped, _ = tf.clip_by_global_norm(list(grads), clip_norm, use_norm=norm)
    return clipped, norm


def _nccl_available() -> bool:
    try:
        from tensorflow.python.ops import nccl_ops  # noqa: F401
    except ImportError:
        return False
    return tf.test.is_built_with_cuda()
