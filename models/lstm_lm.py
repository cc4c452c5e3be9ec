"""Word-level LSTM language model (the PTB "small" model's shape): embedding,
stacked LSTM layers, softmax over the vocabulary at every step.

Every example is an independent window of num_steps tokens that starts from a zero
state, so towers need not carry recurrent state between batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf

from models import layers
from models.base import InputSpec, check_rate
from towers import Features, ModelFn, TowerContext, TowerOutputs


@dataclass(frozen=True)
class Params:
    """hidden_size: width of the embedding and of every LSTM layer; dropout: rate on
    the embedding and after each LSTM layer."""

    vocab_size: int = 10000
    num_steps: int = 20
    hidden_size: int = 200
    num_layers: int = 2
    dropout: float = 0.0

    def __post_init__(self) -> None:
        check_rate("dropout", self.dropout)

    def input_spec(self) -> InputSpec:
        steps = (self.num_steps,)
        return InputSpec(steps, tf.int32, steps, tf.int32, self.vocab_size)


def build_model_fn(params: Params) -> ModelFn:
    """A model_fn taking token ids int32 [batch, num_steps] and the next tokens
    int32 [batch, num_steps].

    loss: mean token cross-entropy. metrics: perplexity = exp(loss) and token accuracy.
    predictions: next-token probabilities [batch, num_steps, vocab_size].
    """

    def model_fn(features: Features, labels: tf.Tensor, ctx: TowerContext) -> TowerOutputs:
        hidden = params.hidden_size
        with tf.compat.v1.variable_scope("lstm_lm"):
            # The reshape makes num_steps static, which the unrolled LSTM needs.
            ids = tf.reshape(features, [-1, params.num_steps])
            x = layers.embedding(ids, params.vocab_size, hidden, dtype=ctx.compute_dtype)
            x = layers.dropout(x, params.dropout, ctx)
            for i in range(params.num_layers):
                x = layers.lstm(x, hidden, scope=f"lstm{i}")
                x = layers.dropout(x, params.dropout, ctx)
            logits = layers.dense(tf.reshape(x, [-1, hidden]), params.vocab_size, scope="softmax")
        # Every example has num_steps tokens, so the token mean is also the mean
        # over examples of their per-token losses, which the builder expects.
        targets = tf.reshape(labels, [-1])
        loss = layers.softmax_cross_entropy(logits, targets)
        probabilities = tf.reshape(tf.nn.softmax(logits), [-1, params.num_steps, params.vocab_size])
        return TowerOutputs(
            loss=loss,
            metrics={"perplexity": tf.exp(loss), "accuracy": layers.accuracy(logits, targets)},
            predictions=probabilities,
        )

    return model_fn
