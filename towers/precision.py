"""Mixed precision: the number types a step computes in, sends gradients in, and scales by.

    build_train_op(..., precision="mixed_bfloat16")
    build_train_op(..., precision=towers.Precision("mixed_float16", gradient_dtype="float16"))

Variables always stay float32 (checkpoints are the same in every precision). A tower
computes in the 16-bit type by casting at its edges:

  inputs     float features are cast to the compute type on the tower's device;
  variables  the tower's variable scope has the compute type as its default dtype: a
             trainable variable asked for without a dtype (or in a 16-bit type) is made
             float32 and read through a cast on the tower's device. One asked for in
             float32 stays float32 (batch-norm scale, offset and statistics), and so
             does state that is not trainable (a model assigns to it);
  Keras      layers made in the tower follow Keras' own policy of the same name
             (mixed_bfloat16, mixed_float16): float32 variables cast where a layer
             reads them, as above;
  outputs    the loss, metrics and predictions leave the tower as float32.

So a plain model function runs in mixed precision unchanged; for accuracy it should
compute its softmax and loss in float32 (the built-in layers do). The gradient of a
cast float32 variable is float32 again, so the update is float32 throughout.

gradient_dtype: the type tower gradients travel in between devices and processes;
a 16-bit type halves the bytes, and they are summed in float32 where they land.

"float64" is not for training: it is how `towers verify` checks that N towers equal
one device without float32's rounding in the way. Everything is float64 there: a
variable asked for without a dtype (or in float32) is made float64, float features
are cast to float64, Keras layers take Keras' float64 policy, gradients travel in
float64 and the loss leaves the tower in float64 (its gradient is the towers'). Only
metrics and predictions leave as float32.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import tensorflow as tf

from towers.context import Features, TowerOutputs
from towers.loss_scale import DynamicLossScale, LossScaler

PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
GRADIENT_DTYPES = ("float32", "bfloat16", "float16")
# Not a training precision (not in PRECISIONS, nor a job's towers.precision): towers
# verify's, to compare towers with one device without float32's rounding.
FLOAT64 = "float64"
_COMPUTE = {"float32": tf.float32, "mixed_bfloat16": tf.bfloat16, "mixed_float16": tf.float16,
            FLOAT64: tf.float64}
_SIXTEEN_BITS = (tf.bfloat16, tf.float16)

CustomGetter = Callable[..., tf.Variable | tf.Tensor]


@dataclass(frozen=True)
class Precision:
    """A precision policy.

    name: one of PRECISIONS, or FLOAT64 (for checking equivalence, not training).
    gradient_dtype: one of GRADIENT_DTYPES, how gradients travel between devices and
        processes (float32: as computed; FLOAT64 takes only that, and sends float64).
    loss_scale: mixed_float16 only: a DynamicLossScale (None there means the
        default one); must be None for the other precisions, which need none.
    """

    name: str = "float32"
    gradient_dtype: str = "float32"
    loss_scale: DynamicLossScale | None = None

    def __post_init__(self) -> None:
        if self.name not in (*PRECISIONS, FLOAT64):
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}; "
                             f"got {self.name!r}")
        if self.name == FLOAT64 and self.gradient_dtype != "float32":
            raise ValueError(f"precision {FLOAT64} sends gradients as computed; got "
                             f"gradient_dtype {self.gradient_dtype!r}")
        if self.gradient_dtype not in GRADIENT_DTYPES:
            raise ValueError(f"gradient_dtype must be one of {', '.join(GRADIENT_DTYPES)}; "
                             f"got {self.gradient_dtype!r}")
        if self.name == "mixed_float16" and self.loss_scale is None:
            object.__setattr__(self, "loss_scale", DynamicLossScale())  # frozen: set once
        elif self.name != "mixed_float16" and self.loss_scale is not None:
            raise ValueError(f"loss_scale is for mixed_float16 only; precision is {self.name}")

    @property
    def compute_dtype(self) -> tf.DType:
        """What the towers compute in: float32, bfloat16 or float16."""
        return _COMPUTE[self.name]

    @property
    def wire_dtype(self) -> tf.DType:
        """What gradients travel in."""
        if self.name == FLOAT64:
            return tf.float64
        return tf.as_dtype(self.gradient_dtype)

    @property
    def loss_dtype(self) -> tf.DType:
        """What a tower's loss, and the weights of the towers' losses, are: float32, or
        float64 in FLOAT64 (the gradients start from them)."""
        return tf.float64 if self.name == FLOAT64 else tf.float32

    def loss_scaler(self, device: str) -> LossScaler | None:
        """The loss scale's graph state on `device`; None when there is no scaling."""
        return self.loss_scale.build(device) if self.loss_scale is not None else None

    def cast_features(self, features: Features) -> Features:
        """Float features in the compute type; integer features (token ids) as they are."""
        def cast(tensor: tf.Tensor) -> tf.Tensor:
            if tensor.dtype.is_floating and tensor.dtype != self.compute_dtype:
                return tf.cast(tensor, self.compute_dtype, name="cast_features")
            return tensor

        return tf.nest.map_structure(cast, features)

    def cast_outputs(self, outputs: TowerOutputs) -> TowerOutputs:
        """The loss in loss_dtype, metrics and predictions as float32, whatever the model
        computed them in."""
        def cast(tensor: tf.Tensor | None, dtype: tf.DType) -> tf.Tensor | None:
            if tensor is None or not tensor.dtype.is_floating or tensor.dtype == dtype:
                return tensor
            return tf.cast(tensor, dtype)

        def to_float32(tensor: tf.Tensor | None) -> tf.Tensor | None:
            return cast(tensor, tf.float32)

        return outputs._replace(loss=cast(outputs.loss, self.loss_dtype),
                                metrics={k: to_float32(v) for k, v in outputs.metrics.items()},
                                predictions=to_float32(outputs.predictions))

    @contextlib.contextmanager
    def keras_layers(self) -> Iterator[None]:
        """Inside, Keras layers are made with Keras' dtype policy of this precision's name
        (float32 variables, computed in 16 bits). Keras is looked up, not imported: only
        a model that has imported it makes Keras layers. Float32 leaves the policy as it is."""
        keras = sys.modules.get("keras")
        if keras is None or self.name == "float32":
            yield
            return
        before, floatx = keras.config.dtype_policy(), keras.config.floatx()
        keras.config.set_dtype_policy(self.name)
        if self.name == FLOAT64:  # what Keras makes outside the policy (its backend's floats)
            keras.config.set_floatx(FLOAT64)
        try:
            yield
        finally:
            keras.config.set_dtype_policy(before)
            keras.config.set_floatx(floatx)

    def wrap_getter(self, inner: CustomGetter, name_scope: str) -> CustomGetter:
        """A custom getter: `inner` (the builder's), with 16-bit requests kept in float32
        and read through a cast. For a variable scope whose dtype is compute_dtype.
        name_scope: the tower's, for the casts (get_variable clears the name scope);
        "" leaves them at the top. In FLOAT64 every float variable is made float64."""
        if self.name == FLOAT64:
            return functools.partial(_float64_getter, inner)
        return functools.partial(_casting_getter, inner, name_scope)

    def send(self, grad):
        """A float32 gradient (tensor or IndexedSlices) as it travels: in gradient_dtype."""
        return cast_gradient(grad, self.wire_dtype)


def _casting_getter(inner: CustomGetter, name_scope: str, getter, name: str, *args, **kwargs):
    """Store 16-bit requests as float32; hand out a cast of a trainable one."""
    requested = tf.as_dtype(kwargs.get("dtype") or tf.float32)
    if requested not in _SIXTEEN_BITS:
        return inner(getter, name, *args, **kwargs)
    kwargs["dtype"] = tf.float32
    variable = inner(getter, name, *args, **kwargs)
    if kwargs.get("trainable") is False:
        return variable
    with tf.name_scope(name_scope) if name_scope else contextlib.nullcontext():
        return tf.cast(variable, requested, name=f"{name}_cast")


def _float64_getter(inner: CustomGetter, getter, name: str, *args, **kwargs):
    """Every float variable float64, whatever type it is asked for in (a model that
    asks for float32 explicitly, as TF1 code often does, computes in float64 too)."""
    if tf.as_dtype(kwargs.get("dtype") or tf.float32).is_floating:
        kwargs["dtype"] = tf.float64
    return inner(getter, name, *args, **kwargs)


def cast_gradient(grad, dtype: tf.DType):
    """grad (tensor, IndexedSlices or None) with its values cast to dtype; as is if already."""
    if grad is None or grad.dtype == dtype:
        return grad
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(tf.cast(grad.values, dtype), grad.indices, grad.dense_shape)
    return tf.cast(grad, dtype)


def resolve(precision: str | Precision) -> Precision:
    """A Precision from its name, or as given."""
    if isinstance(precision, Precision):
        return precision
    if isinstance(precision, str):
        return Precision(precision)
    raise ValueError(f"precision must be one of {', '.join(PRECISIONS)} or a towers.Precision; "
                     f"got {precision!r}")
