"""What build_train_op checks of a model from the ops its first tower made: what would
otherwise train silently other than one device on the whole batch would, or not train.

Two things a model can do that no error would show (each raises ValueError):
  read a trainable variable made before build_train_op (a Keras model built outside
      the model function): towers takes the gradients of the variables the model
      function makes (towers.sharing), so that one would never change;
  compute on a Keras layer's weights in float32 while the towers compute in 16 bits
      (a Keras model made outside the towers keeps the dtype policy it was made with;
      towers gives the layers made inside the towers the precision's policy): the
      step would silently run in float32.

And one that does nothing, which a model ported from elsewhere often does (TensorFlow's
CIFAR-10 tutorial makes its variables under `tf.device('/cpu:0')`): place its own ops.
Each tower's ops go on its device and the variables where the update mode keeps them
(towers.placement: the tower's device function is outermost, so it decides), so a
`tf.device` in the model function has no effect; it is noted (`own_placements`) and
the caller warned once.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from collections.abc import Iterator

import tensorflow as tf

from towers.precision import Precision

# Ops that do a layer's arithmetic on its weights: where the compute type shows.
_WEIGHT_OPS = frozenset({"MatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum", "Conv2D",
                         "Conv3D", "DepthwiseConv2dNative"})
_PASS_THROUGH = frozenset({"ReadVariableOp", "Identity"})


def check_first_tower(ops: list[tf.Operation], trainable: list[tf.Variable],
                      made: list[tf.Variable], precision: Precision) -> None:
    """ops: what tower 0's model function made; trainable: the variables towers trains
    for it; made: the variables it made without get_variable (Keras layers,
    tf.Variable). Raises ValueError naming the variable."""
    _check_untrained_reads(ops, trainable)
    if precision.compute_dtype != tf.float32:
        _check_compute_type(ops, made, precision)


def _check_untrained_reads(ops: list[tf.Operation], trainable: list[tf.Variable]) -> None:
    trained = {_handle(v) for v in trainable}
    others = {_handle(v): v for v in tf.compat.v1.trainable_variables()}
    for op in ops:
        for tensor in op.inputs:
            var = others.get(tensor.op) if tensor.op not in trained else None
            if var is not None:
                raise ValueError(
                    f"the model function reads trainable variable {var.op.name}, made "
                    f"before build_train_op, which towers would never train (it trains the "
                    f"variables the model function makes): make it, or the Keras model "
                    f"holding it, inside the model function, or make it trainable=False")


def _check_compute_type(ops: list[tf.Operation], made: list[tf.Variable],
                        precision: Precision) -> None:
    weights = {_handle(v): v for v in made if v.trainable}
    for op in ops:
        if op.type not in _WEIGHT_OPS or op.outputs[0].dtype != tf.float32:
            continue
        for tensor in op.inputs:
            var = weights.get(_source(tensor))
            if var is not None:
                raise ValueError(
                    f"precision={precision.name}: {op.name} computes on {var.op.name} in "
                    f"float32 while the towers compute in {precision.compute_dtype.name}; a "
                    f"Keras model made outside the model function keeps the dtype policy "
                    f"it was made with: make it inside the model function (towers gives its "
                    f"layers Keras' {precision.name} policy), or give it "
                    f"dtype_policy='{precision.name}' (a tf.Variable: read it cast to "
                    f"ctx.compute_dtype)")


def _package_dir(name: str) -> str | None:
    """Where package `name` is installed, without importing it (Keras: only a model that
    uses it need pay for its import)."""
    spec = importlib.util.find_spec(name)
    return os.path.dirname(spec.origin) + os.sep if spec and spec.origin else None


# The code whose own tf.device calls are not the model's: TensorFlow, Keras, towers.
_LIBRARIES = tuple(d for d in (_package_dir("tensorflow"), _package_dir("keras"),
                               os.path.dirname(os.path.abspath(__file__)) + os.sep) if d)


@contextlib.contextmanager
def own_placements() -> Iterator[list[str]]:
    """While inside, every tf.device and tf.compat.v1.device call made by code outside
    TensorFlow, Keras and towers (a model function's own) is noted in the list yielded,
    as 'tf.device(<device>) at <file>:<line>'."""
    noted: list[str] = []
    originals = [(tf, "device", tf.device), (tf.compat.v1, "device", tf.compat.v1.device)]

    def noting(original):
        def device(device_name_or_function):
            caller = sys._getframe(1).f_code.co_filename  # noqa: SLF001 (who placed)
            if not caller.startswith(_LIBRARIES):
                where = f"{caller}:{sys._getframe(1).f_lineno}"  # noqa: SLF001
                noted.append(f"tf.device({device_name_or_function!r}) at {where}")
            return original(device_name_or_function)

        return device

    for module, name, original in originals:
        setattr(module, name, noting(original))
    try:
        yield noted
    finally:
        for module, name, original in originals:
            setattr(module, name, original)


def placement_warning(noted: list[str]) -> str:
    """The one warning for a model function that placed its own ops (`noted`)."""
    more = f" (and {len(noted) - 1} more)" if len(noted) > 1 else ""
    return (f"the model function places ops itself: {noted[0]}{more}; towers puts each "
            f"tower's ops on its device and the variables where the update mode keeps them, "
            f"so it has no effect: remove it")


def _source(tensor: tf.Tensor) -> tf.Operation:
    """The op a value comes from, through reads and identities (a variable's handle)."""
    op = tensor.op
    while op.type in _PASS_THROUGH and op.inputs:
        op = op.inputs[0].op
    return op


def _handle(var: tf.Variable) -> tf.Operation | None:
    return getattr(var, "handle", var).op
