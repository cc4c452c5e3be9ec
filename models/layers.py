"""Layers written on ``tf.compat.v1.get_variable`` and ``tf.nn`` ops.

Keras 3 removed ``tf.compat.v1.layers``, and the tower builder shares variables
between towers by re-entering a variable scope with reuse, so every variable
here comes from ``get_variable`` (a ``tf.Variable`` would be duplicated per
tower). No function places ops on a device: the builder does that.

Each function takes a ``scope`` naming its variables; call it with distinct
scopes within one model.

Mixed precision: a tower's variable scope has the compute type as its default dtype,
so a variable asked for without a dtype is stored float32 and read through a cast to
it (towers.Precision). What must stay float32 asks for float32: batch-norm scale,
offset and statistics, the embedding table (its rows are cast after the lookup); the
loss and its softmax are computed in float32.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

import towers

v1 = tf.compat.v1


def he_init() -> Any:
    """He et al. (2015) truncated-normal init: keeps activation variance steady through ReLUs."""
    return v1.variance_scaling_initializer(
        scale=2.0, mode="fan_in", distribution="truncated_normal"
    )


def glorot_init() -> Any:
    """Glorot uniform init, for layers not followed by a ReLU (logits, LSTM gates)."""
    return v1.glorot_uniform_initializer()


def dense(
    x: tf.Tensor,
    units: int,
    scope: str = "dense",
    use_bias: bool = True,
    initializer: Any = None,
) -> tf.Tensor:
    """Fully connected layer without activation.

    x: [batch, in_dim] with a static in_dim. Returns [batch, units].
    Variables: kernel [in_dim, units], bias [units].
    """
    in_dim = _static_dim(x, -1, "dense")
    with v1.variable_scope(scope):
        kernel = v1.get_variable(
            "kernel", [in_dim, units], initializer=initializer or glorot_init()
        )
        y = tf.matmul(x, kernel)
        if use_bias:
            y += v1.get_variable("bias", [units], initializer=v1.zeros_initializer())
    return y


def conv2d(
    x: tf.Tensor,
    filters: int,
    kernel_size: int,
    strides: int = 1,
    padding: str = "SAME",
    scope: str = "conv",
    use_bias: bool = True,
    initializer: Any = None,
) -> tf.Tensor:
    """2-D convolution without activation, NHWC.

    x: [batch, height, width, in_channels] with static in_channels.
    Returns [batch, height', width', filters]; with 'SAME' padding
    height' = ceil(height / strides), with 'VALID' ceil((height - kernel_size + 1) / strides).
    Variables: kernel [kernel_size, kernel_size, in_channels, filters], bias [filters].
    """
    in_channels = _static_dim(x, -1, "conv2d")
    shape = [kernel_size, kernel_size, in_channels, filters]
    with v1.variable_scope(scope):
        kernel = v1.get_variable("kernel", shape, initializer=initializer or he_init())
        y = tf.nn.conv2d(x, kernel, strides=strides, padding=padding)
        if use_bias:
            y += v1.get_variable("bias", [filters], initializer=v1.zeros_initializer())
    return y


def max_pool(
    x: tf.Tensor, size: int = 2, strides: int | None = None, padding: str = "SAME"
) -> tf.Tensor:
    """Max pooling, NHWC.

    x: [batch, h, w, c]. Returns [batch, ceil(h / strides), ceil(w / strides), c] with
    'SAME' padding. strides defaults to size (non-overlapping windows).
    """
    return tf.nn.max_pool2d(x, ksize=size, strides=strides or size, padding=padding)


def global_avg_pool(x: tf.Tensor) -> tf.Tensor:
    """Mean over the spatial dimensions. x: [batch, h, w, c] -> [batch, c]."""
    return tf.reduce_mean(x, axis=[1, 2])


def flatten(x: tf.Tensor) -> tf.Tensor:
    """x: [batch, d1, d2, ...] with static d1, d2, ... -> [batch, d1 * d2 * ...]."""
    size = 1
    for axis in range(1, x.shape.rank):
        size *= _static_dim(x, axis, "flatten")
    return tf.reshape(x, [-1, size])


def batch_norm(
    x: tf.Tensor,
    is_training: bool,
    decay: float = 0.9,
    epsilon: float = 1e-5,
    scope: str = "batch_norm",
    across: Callable[[tf.Tensor], tf.Tensor] | None = None,
) -> tf.Tensor:
    """Batch normalization over every axis but the last (channels).

    x: [batch, channels] or [batch, h, w, channels] (NHWC), static channels.
    Returns a tensor of x's shape and type.
    Variables: beta, gamma (trainable), moving_mean, moving_variance (not
    trainable), each [channels] and float32 whatever x's type: the fused kernel
    takes a 16-bit x with float32 parameters and computes the statistics in float32.
    (In towers verify's float64 all is float64, and plain ops stand in for the fused
    kernel, which has no float64.)

    Training normalizes with the batch statistics and adds two assign ops,
    moving <- decay * moving + (1 - decay) * batch, to GraphKeys.UPDATE_OPS;
    the caller runs them with the train op (the builder takes tower 0's).
    Evaluation normalizes with the moving statistics and adds no ops.
    across: a tower's `ctx.batch_sum`: with synchronized batch norm the statistics
        are the whole global batch's (summed across the towers), computed as the
        fused kernel computes them on one device; None: this batch's own, fused.
    """
    channels = _static_dim(x, -1, "batch_norm")
    zeros, ones = v1.zeros_initializer(), v1.ones_initializer()
    f32 = tf.float32
    with v1.variable_scope(scope):
        beta = v1.get_variable("beta", [channels], f32, initializer=zeros)
        gamma = v1.get_variable("gamma", [channels], f32, initializer=ones)
        moving_mean = v1.get_variable(
            "moving_mean", [channels], f32, initializer=zeros, trainable=False
        )
        moving_var = v1.get_variable(
            "moving_variance", [channels], f32, initializer=ones, trainable=False
        )
        # The fused kernel wants NHWC; view [batch, channels] as [batch, 1, 1, channels].
        x4 = x if x.shape.rank == 4 else tf.reshape(x, [-1, 1, 1, channels])
        if not is_training and x.dtype == tf.float64:
            y = _normalized(x4, moving_mean, moving_var, gamma, beta, epsilon)
        elif not is_training:
            y, _, _ = v1.nn.fused_batch_norm(
                x4, gamma, beta, moving_mean, moving_var, epsilon=epsilon, is_training=False
            )
        else:
            if across is None and x.dtype != tf.float64:
                y, mean, variance = v1.nn.fused_batch_norm(
                    x4, gamma, beta, epsilon=epsilon, is_training=True
                )
            else:
                y, mean, variance = _synchronized_batch_norm(x4, gamma, beta, epsilon, across)
            for moving, batch_value in ((moving_mean, mean), (moving_var, variance)):
                # read_value=False makes this an Operation (not a variable-like read),
                # named under the caller's name scope so the builder can pick tower 0's.
                update = moving.assign_sub((moving - batch_value) * (1.0 - decay), read_value=False)
                v1.add_to_collection(v1.GraphKeys.UPDATE_OPS, update)
    return y if x.shape.rank == 4 else tf.reshape(y, tf.shape(x))


def _synchronized_batch_norm(
    x: tf.Tensor, gamma: tf.Tensor, beta: tf.Tensor, epsilon: float,
    across: Callable[[tf.Tensor], tf.Tensor] | None,
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """What fused_batch_norm returns in training, over the global batch (across None:
    this batch): x [b, h, w, c] normalized (in x's type, the statistics float32, float64
    for a float64 x), the mean [c] and the variance [c] with Bessel's correction
    (n / (n - 1)), as the fused kernel gives it for the moving statistics while
    normalizing with the biased one."""
    mean, variance, count = towers.batch_moments(x, [0, 1, 2], across)
    y = _normalized(x, mean, variance, gamma, beta, epsilon)
    corrected = variance * count / tf.maximum(count - 1.0, 1.0)
    return y, mean, corrected


def _normalized(x: tf.Tensor, mean: tf.Tensor, variance: tf.Tensor, gamma: tf.Tensor,
                beta: tf.Tensor, epsilon: float) -> tf.Tensor:
    """x [b, h, w, c] normalized by the given statistics [c] with the fused kernel (one
    pass over x, as in training; plain ops would be several), with a gradient that
    reaches the statistics too: the kernel's own treats them as constants. A float64 x
    (the kernel has no float64): plain ops, whose gradient TensorFlow takes."""
    if x.dtype == tf.float64:
        return tf.nn.batch_normalization(x, mean, variance, beta, gamma, epsilon)

    @towers.custom_gradient
    def normalized(x, mean, variance, gamma, beta):
        y, _, _, _, _, reserve = tf.raw_ops.FusedBatchNormV3(
            x=x, scale=gamma, offset=beta, mean=mean, variance=variance, epsilon=epsilon,
            is_training=False)

        def grad(dy):
            dx, dgamma, dbeta, _, _ = tf.raw_ops.FusedBatchNormGradV3(
                y_backprop=dy, x=x, scale=gamma, reserve_space_1=mean,
                reserve_space_2=variance, reserve_space_3=reserve, epsilon=epsilon,
                is_training=False)
            # y = gamma (x - mean) s + beta with s = (variance + epsilon)^-1/2, and the
            # kernel's dgamma = sum dy (x - mean) s and dbeta = sum dy, so
            # d/dmean = -gamma s dbeta and d/dvariance = -gamma s^2 dgamma / 2.
            s = tf.math.rsqrt(variance + epsilon)
            return dx, -gamma * s * dbeta, -0.5 * gamma * s * s * dgamma, dgamma, dbeta

        return y, grad

    return normalized(x, mean, variance, gamma, beta)


def dropout(x: tf.Tensor, rate: float, ctx: towers.TowerContext) -> tf.Tensor:
    """Zero each element with probability ``rate`` and scale the rest by 1 / (1 - rate)
    when training; the identity otherwise. x: [n, ...] (n the tower's examples); returns
    a tensor of x's shape. Each example's mask is its own draw (ctx.draws: a function of
    its position in the data), so N towers drop what one device drops; a tower without
    positions draws from TensorFlow's stateful stream."""
    if not ctx.is_training or rate == 0.0:
        return x
    if ctx.draws is None:
        return tf.nn.dropout(x, rate=rate)
    keep = ctx.draws.uniform(x.shape[1:]) >= rate
    return x * tf.cast(keep, x.dtype) / tf.cast(1.0 - rate, x.dtype)


def embedding(
    ids: tf.Tensor,
    vocab_size: int,
    dim: int,
    scope: str = "embedding",
    initializer: Any = None,
    dtype: tf.DType = tf.float32,
) -> tf.Tensor:
    """Look up rows of an embedding matrix.

    ids: int tensor of any shape [...], values in [0, vocab_size). Returns [..., dim]
    of `dtype` (the tower's compute type).
    Variable: embedding [vocab_size, dim], float32: the rows looked up are cast, not the
    table. Its gradient is IndexedSlices (only the looked-up rows), which keeps the
    all-tower gradient sum cheap for big vocabularies.
    """
    init = initializer or v1.random_uniform_initializer(-0.05, 0.05)
    with v1.variable_scope(scope):
        table = v1.get_variable("embedding", [vocab_size, dim], tf.float32, initializer=init)
    return tf.cast(tf.nn.embedding_lookup(table, ids), dtype)


def lstm(inputs: tf.Tensor, hidden: int, scope: str = "lstm", initializer: Any = None) -> tf.Tensor:
    """One LSTM layer unrolled over the static time dimension, from a zero state.

    inputs: [batch, time, dim] with static time and dim. Returns [batch, time, hidden],
    the hidden state h at every step.
    Variables: kernel [dim + hidden, 4 * hidden] (rows: input then h; columns: the
    gates i, f, g, o), bias [4 * hidden], with the forget gate's bias set to 1 so the
    cell remembers by default early in training (Jozefowicz et al., 2015).
    """
    time = _static_dim(inputs, 1, "lstm")
    dim = _static_dim(inputs, 2, "lstm")
    forget_bias = [0.0] * hidden + [1.0] * hidden + [0.0] * (2 * hidden)
    with v1.variable_scope(scope):
        kernel = v1.get_variable(
            "kernel", [dim + hidden, 4 * hidden], initializer=initializer or glorot_init()
        )
        bias = v1.get_variable(
            "bias", [4 * hidden], initializer=v1.constant_initializer(forget_bias)
        )
    # The input rows of the kernel do not depend on the recurrent state, so project
    # every time step in one large matmul instead of `time` small ones.
    input_kernel, recurrent_kernel = tf.split(kernel, [dim, hidden])
    projected = tf.matmul(tf.reshape(inputs, [-1, dim]), input_kernel) + bias
    # One unstack, not a slice per step: each slice's gradient is a zero tensor of the
    # whole sequence (time of them, summed), the unstack's one stack.
    projected = tf.unstack(tf.reshape(projected, [-1, time, 4 * hidden]), axis=1)

    batch = tf.shape(inputs)[0]
    c = h = tf.zeros([batch, hidden], dtype=inputs.dtype)
    outputs = []
    for t in range(time):
        gates = projected[t] + tf.matmul(h, recurrent_kernel)
        i, f, g, o = tf.split(gates, 4, axis=1)
        c = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(g)
        h = tf.sigmoid(o) * tf.tanh(c)
        outputs.append(h)
    return tf.stack(outputs, axis=1)


def softmax_cross_entropy(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """Mean cross-entropy, in float32 whatever the logits' type (a 16-bit softmax loses
    the small probabilities). logits: [n, num_classes], labels: int [n]. Returns a
    float32 scalar."""
    logits = tf.cast(logits, tf.float32)
    losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    return tf.reduce_mean(losses)


def accuracy(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """Fraction of argmax predictions equal to the labels.

    logits: [n, num_classes], labels: int [n]. Returns a float32 scalar.
    """
    predictions = tf.argmax(logits, axis=-1, output_type=labels.dtype)
    return tf.reduce_mean(tf.cast(tf.equal(predictions, labels), tf.float32))


def kernel_tracker(kernels: list[tf.Tensor]) -> Callable[..., Any]:
    """A variable_scope custom getter that appends every variable named ``.../kernel``
    to ``kernels``, also when the variable is reused, so each tower can add weight
    decay on exactly the kernels it read (shared, or its own copies when replicated)."""

    # TF passes the next getter as the keyword argument `getter`, so the name is fixed.
    def track(getter: Callable[..., Any], name: str, *args: Any, **kwargs: Any) -> Any:
        variable = getter(name, *args, **kwargs)
        if name.endswith("/kernel"):
            kernels.append(variable)
        return variable

    return track


def l2_weight_decay(kernels: list[tf.Tensor], rate: float) -> tf.Tensor:
    """rate * sum of ||k||^2 / 2 over the kernels, summed in float32 (kernels read in a
    16-bit type are cast back); a float32 scalar (0 for rate 0)."""
    if rate == 0.0 or not kernels:
        return tf.constant(0.0)
    return rate * tf.add_n([tf.nn.l2_loss(tf.cast(k, tf.float32)) for k in kernels])


def _static_dim(x: tf.Tensor, axis: int, layer: str) -> int:
    """The static size of x along axis; layers need it to shape their variables."""
    size = x.shape[axis]
    if size is None:
        raise ValueError(f"{layer}: dimension {axis} of {x.name} must be static, shape {x.shape}")
    return int(size)
