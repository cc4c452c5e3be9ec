"""LeNet-style CNN for small grey-scale images (the classic MNIST example, slimmed
down so it trains in minutes on two CPU cores)."""

from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf

from models import layers
from models.base import InputSpec, check_rate, classifier_outputs
from towers import Features, ModelFn, TowerContext, TowerOutputs


@dataclass(frozen=True)
class Params:
    """filters: output channels of each conv layer (each followed by a 2x2 max pool);
    dense_units: width of the ReLU layer before the logits; dropout: its rate."""

    image_size: int = 28
    channels: int = 1
    num_classes: int = 10
    filters: tuple[int, ...] = (32, 64)
    kernel_size: int = 5
    dense_units: int = 256
    dropout: float = 0.5

    def __post_init__(self) -> None:
        check_rate("dropout", self.dropout)

    def input_spec(self) -> InputSpec:
        shape = (self.image_size, self.image_size, self.channels)
        return InputSpec(shape, tf.float32, (), tf.int32, self.num_classes)


def build_model_fn(params: Params) -> ModelFn:
    """A model_fn taking features float32 [batch, image_size, image_size, channels]
    (or the same values flattened) and labels int32 [batch]."""

    def model_fn(features: Features, labels: tf.Tensor, ctx: TowerContext) -> TowerOutputs:
        size = params.image_size
        with tf.compat.v1.variable_scope("convnet"):
            x = tf.reshape(features, [-1, size, size, params.channels])
            for i, filters in enumerate(params.filters):
                x = tf.nn.relu(layers.conv2d(x, filters, params.kernel_size, scope=f"conv{i}"))
                x = layers.max_pool(x, 2)
            x = layers.flatten(x)
            x = tf.nn.relu(
                layers.dense(x, params.dense_units, scope="dense", initializer=layers.he_init())
            )
            x = layers.dropout(x, params.dropout, ctx)
            logits = layers.dense(x, params.num_classes, scope="logits")
        return classifier_outputs(logits, labels)

    return model_fn
