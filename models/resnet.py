"""CIFAR-style ResNet (He et al. 2016, section 4.2): ResNet-20 and ResNet-56.

A 3x3 conv, then three stages of n basic blocks with base, 2*base and 4*base filters
(the first block of stages 2 and 3 halves the resolution), global average pooling
and a dense layer; depth = 6n + 2. Shortcuts that change shape subsample and
zero-pad channels (the paper's option A), so they add no parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf

from models import layers
from models.base import InputSpec, check_non_negative, check_rate, classifier_outputs
from towers import Features, ModelFn, TowerContext, TowerOutputs


@dataclass(frozen=True)
class Params:
    """weight_decay: L2 rate on every conv and dense kernel, added into the loss;
    base_filters: filters of the first stage (16 in the paper)."""

    image_size: int = 32
    channels: int = 3
    num_classes: int = 10
    base_filters: int = 16
    weight_decay: float = 1e-4
    batch_norm_decay: float = 0.9
    batch_norm_epsilon: float = 1e-5

    def __post_init__(self) -> None:
        check_non_negative("weight_decay", self.weight_decay)
        check_rate("batch_norm_decay", self.batch_norm_decay)
        check_non_negative("batch_norm_epsilon", self.batch_norm_epsilon)

    def input_spec(self) -> InputSpec:
        shape = (self.image_size, self.image_size, self.channels)
        return InputSpec(shape, tf.float32, (), tf.int32, self.num_classes)


def resnet20(params: Params) -> ModelFn:
    """ResNet-20: 3 blocks per stage."""
    return build_model_fn(params, depth=20)


def resnet56(params: Params) -> ModelFn:
    """ResNet-56: 9 blocks per stage."""
    return build_model_fn(params, depth=56)


def build_model_fn(params: Params, depth: int) -> ModelFn:
    """A model_fn taking features float32 [batch, image_size, image_size, channels]
    and labels int32 [batch]; depth must be 6n + 2."""
    if depth < 8 or (depth - 2) % 6:
        raise ValueError(f"ResNet depth must be 6n + 2 with n >= 1, got {depth}")
    blocks_per_stage = (depth - 2) // 6

    def model_fn(features: Features, labels: tf.Tensor, ctx: TowerContext) -> TowerOutputs:
        kernels: list[tf.Tensor] = []
        getter = layers.kernel_tracker(kernels)
        with tf.compat.v1.variable_scope(f"resnet{depth}", custom_getter=getter):
            x = tf.reshape(features, [-1, params.image_size, params.image_size, params.channels])
            x = layers.conv2d(x, params.base_filters, 3, use_bias=False, scope="stem")
            x = tf.nn.relu(_batch_norm(x, params, ctx, "stem_bn"))
            for stage in range(3):
                filters = params.base_filters * 2**stage
                for block in range(blocks_per_stage):
                    stride = 2 if stage > 0 and block == 0 else 1
                    scope = f"stage{stage + 1}_block{block + 1}"
                    x = _basic_block(x, filters, stride, params, ctx, scope)
            logits = layers.dense(layers.global_avg_pool(x), params.num_classes, scope="logits")
        return classifier_outputs(
            logits, labels, extra_loss=layers.l2_weight_decay(kernels, params.weight_decay)
        )

    return model_fn


def _basic_block(
    x: tf.Tensor, filters: int, stride: int, params: Params, ctx: TowerContext, scope: str
) -> tf.Tensor:
    """Two 3x3 convs with a shortcut. x: [batch, h, w, c] -> [batch, h / stride, w / stride,
    filters]."""
    with tf.compat.v1.variable_scope(scope):
        y = layers.conv2d(x, filters, 3, strides=stride, use_bias=False, scope="conv1")
        y = tf.nn.relu(_batch_norm(y, params, ctx, "bn1"))
        y = layers.conv2d(y, filters, 3, use_bias=False, scope="conv2")
        y = _batch_norm(y, params, ctx, "bn2")
    return tf.nn.relu(y + _shortcut(x, filters, stride))


def _shortcut(x: tf.Tensor, filters: int, stride: int) -> tf.Tensor:
    """Option A: keep every stride-th pixel and zero-pad the new channels on both sides."""
    if stride > 1:
        # x[:, ::stride, ::stride] as a 1x1 pooling: the same values, and a gradient
        # that writes each pixel once (the strided slice's rewrote the whole input).
        x = tf.nn.avg_pool2d(x, 1, stride, "VALID")
    extra = filters - x.shape[-1]
    if extra:
        x = tf.pad(x, [[0, 0], [0, 0], [0, 0], [extra // 2, extra - extra // 2]])
    return x


def _batch_norm(x: tf.Tensor, params: Params, ctx: TowerContext, scope: str) -> tf.Tensor:
    return layers.batch_norm(
        x, ctx.is_training, params.batch_norm_decay, params.batch_norm_epsilon, scope=scope,
        across=ctx.batch_sum,
    )
