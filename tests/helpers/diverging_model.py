"""The divergence tests' model: the built-in mlp, whose gradient is NaN exactly in the
steps whose batch holds a marked example, while its loss stays finite.

Data can no longer carry the fault: towers refuses non-finite features before
training (they would be bad input, not a divergence). So a poisoned example is marked
by a finite feature of MARK, which this model reads as "diverge here": it feeds the mlp
a zero in its place and makes every gradient of that step NaN. The loss it reports is
the mlp's own, finite, so a loss-only check (TensorFlow's NanTensorHook) would let the
update through; only a check of the gradients stops it. Variables are the mlp's (same
names), so a job may switch between this model and `mlp` on one checkpoint.
"""

import tensorflow as tf

import models.mlp
import towers

MARK = 1e30  # finite in float32; no real feature of the tests' data comes near it


def build(*, input_dim: int, hidden_units: list[int], num_classes: int) -> towers.ModelFn:
    mlp = models.mlp.build_model_fn(
        models.mlp.Params(input_dim, tuple(hidden_units), num_classes))

    def model_fn(features, labels, ctx):
        marked = tf.abs(features) >= MARK / 2
        outputs = mlp(tf.where(marked, tf.zeros_like(features), features), labels, ctx)
        return outputs._replace(loss=_nan_gradient_if(tf.reduce_any(marked), outputs.loss))

    return model_fn


def _nan_gradient_if(flag: tf.Tensor, loss: tf.Tensor) -> tf.Tensor:
    """loss unchanged; its gradient NaN where flag is true."""

    @towers.custom_gradient
    def identity(x):
        def gradient(upstream):
            return upstream * tf.where(flag, float("nan"), 1.0)

        return tf.identity(x), gradient

    return identity(loss)
