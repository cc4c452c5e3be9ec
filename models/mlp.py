"""Multi-layer perceptron classifier on flat float features."""

from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf

from models import layers
from models.base import InputSpec, check_rate, classifier_outputs
from towers import Features, ModelFn, TowerContext, TowerOutputs


@dataclass(frozen=True)
class Params:
    """input_dim: features per example; hidden_units: width of each ReLU layer
    (empty: a linear classifier); dropout: rate after each hidden layer."""

    input_dim: int = 784
    hidden_units: tuple[int, ...] = (256, 256)
    num_classes: int = 10
    dropout: float = 0.0

    def __post_init__(self) -> None:
        check_rate("dropout", self.dropout)

    def input_spec(self) -> InputSpec:
        return InputSpec((self.input_dim,), tf.float32, (), tf.int32, self.num_classes)


def build_model_fn(params: Params) -> ModelFn:
    """A model_fn taking features float32 [batch, input_dim] and labels int32 [batch]."""

    def model_fn(features: Features, labels: tf.Tensor, ctx: TowerContext) -> TowerOutputs:
        with tf.compat.v1.variable_scope("mlp"):
            x = tf.reshape(features, [-1, params.input_dim])
            for i, units in enumerate(params.hidden_units):
                x = tf.nn.relu(
                    layers.dense(x, units, scope=f"hidden{i}", initializer=layers.he_init())
                )
                x = layers.dropout(x, params.dropout, ctx)
            logits = layers.dense(x, params.num_classes, scope="logits")
        return classifier_outputs(logits, labels)

    return model_fn
