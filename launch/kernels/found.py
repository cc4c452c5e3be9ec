"""The kernels a training step runs: its convolutions and matrix products, found in the
built graph with their shapes, so each can be timed alone (launch.kernels.timing).

A Kernel is plain data (it crosses a pipe, and keys the probe's cache): the op type,
the shapes of its inputs and output, and the attributes that change its work (strides,
padding, transposes). Its number type is not part of it: the same kernel is timed in
float32 and in a 16-bit type.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from typing import NamedTuple

FORWARD, GRADIENT = "forward", "gradient"

# The op types timed, and the attributes of each that change the work it does. The
# operand of the convolution gradients that is a shape (input_sizes, filter_sizes)
# is the op's output shape, so every kernel is rebuilt from shapes alone.
CONVOLUTIONS = ("Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter")
PRODUCTS = ("MatMul", "BatchMatMulV2", "BatchMatMulV3")
_CONV_ATTRS = ("strides", "padding", "explicit_paddings", "data_format", "dilations")
ATTRS = {**{op: _CONV_ATTRS for op in CONVOLUTIONS},
         "MatMul": ("transpose_a", "transpose_b"),
         "BatchMatMulV2": ("adj_x", "adj_y"), "BatchMatMulV3": ("adj_x", "adj_y")}
_FLOAT_OPERANDS = {"Conv2D": (0, 1), "Conv2DBackpropInput": (1, 2),
                   "Conv2DBackpropFilter": (0, 2)}


class Kernel(NamedTuple):
    """One convolution or matrix product, as the step runs it.

    op: its TensorFlow op type (a key of ATTRS). operands: the shapes of its float
    inputs, in the op's order ([batch, h, w, c] and [kh, kw, c_in, c_out] for a
    convolution; [m, k] and [k, n] for a product); output: the shape it makes.
    attrs: (name, value) pairs, values as plain lists, strings and booleans.
    part: FORWARD, or GRADIENT for the ops of the backward pass.
    """

    op: str
    operands: tuple[tuple[int, ...], ...]
    output: tuple[int, ...]
    attrs: tuple[tuple[str, object], ...]
    part: str

    @property
    def key(self) -> str:
        """A string naming the kernel exactly (the probe's cache is keyed by it)."""
        attrs = ",".join(f"{name}={value}" for name, value in self.attrs)
        return f"{self.op}{list(self.operands)}->{list(self.output)}[{attrs}]"

    @property
    def flops(self) -> int:
        """Floating-point operations of one run (a multiply and an add count two)."""
        if self.op in PRODUCTS:
            attrs = dict(self.attrs)
            rows, inner = self.operands[0][-2:]
            if attrs.get("transpose_a") or attrs.get("adj_x"):
                inner = rows
            return 2 * math.prod(self.output) * inner
        # A convolution's three kernels do the forward's work: every output element
        # (of the forward) sums kh * kw * c_in products.
        image = self.output if self.op == "Conv2D" else self.operands[-1]
        window = self.output if self.op == "Conv2DBackpropFilter" else self.operands[1]
        return 2 * math.prod(image) * math.prod(window[:3])


def kernels_of(ops: Iterable, batch: int | None = None) -> Counter:
    """The kernels among `ops` (tf.Operations: those a train op runs), each with how
    many times one step runs it. batch: the size of an unknown first dimension (the
    per-tower batch of a graph built for any batch size); a kernel with other unknown
    dimensions is left out (it cannot be built alone)."""
    found: Counter = Counter()
    for op in ops:
        if op.type not in ATTRS:
            continue
        kernel = _kernel(op, batch)
        if kernel is not None:
            found[kernel] += 1
    return found


def _kernel(op, batch: int | None) -> Kernel | None:
    float_inputs = [op.inputs[i] for i in _FLOAT_OPERANDS.get(op.type, (0, 1))]
    shapes = [_static(t.shape, batch) for t in [*float_inputs, op.outputs[0]]]
    if any(shape is None for shape in shapes):
        return None
    attrs = tuple((name, _plain(op.get_attr(name))) for name in ATTRS[op.type]
                  if name in op.node_def.attr)
    return Kernel(op.type, tuple(shapes[:-1]), shapes[-1], attrs, _part(op))


def _static(shape, batch: int | None) -> tuple[int, ...] | None:
    if shape.rank is None:
        return None
    dims = shape.as_list()
    if dims and dims[0] is None and batch is not None:
        dims[0] = batch
    return None if None in dims else tuple(dims)


def _plain(value):
    """An attribute as JSON-friendly data: bytes as str, lists as tuples."""
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list):
        return tuple(_plain(v) for v in value)
    return value


def _part(op) -> str:
    """GRADIENT for the ops tf.gradients made (under a "gradients" name scope)."""
    if op.type in CONVOLUTIONS[1:]:
        return GRADIENT
    scopes = op.name.split("/")[:-1]
    return GRADIENT if any(s == "gradients" or s.startswith("gradients_") for s in scopes) \
        else FORWARD
