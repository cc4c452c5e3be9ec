"""The noise a model draws while it trains, set to rate 0 for `towers verify`, or named.

N towers equal one device only up to the noise a model adds: a dropout mask drawn for
a tower's shard is not the one device's mask for the same examples. So while verify
builds the model, the layers it knows that draw noise pass their input through, as
at rate 0 (what each does at rate 0, or with training=False):

  Keras      Dropout, SpatialDropout1D/2D/3D, GaussianDropout, GaussianNoise,
             AlphaDropout (keras.applications' stochastic depth is a Dropout);
  TensorFlow tf.nn.dropout and tf.compat.v1.nn.dropout (the built-in models' dropout
             uses it when, as here, the batch comes without its examples' positions).

Any other random draw the loss depends on (a hand-written stochastic depth on
tf.random.uniform, an augmentation layer) is found in the graph afterwards
(`draws_in`) and named: verify cannot compare through it.
"""

from __future__ import annotations

import contextlib
import sys
from collections import Counter
from collections.abc import Iterator

import tensorflow as tf

KERAS_NOISE = ("Dropout", "SpatialDropout1D", "SpatialDropout2D", "SpatialDropout3D",
               "GaussianDropout", "GaussianNoise", "AlphaDropout")

# The op types that draw random numbers (stateful and stateless).
RANDOM_OPS = frozenset({
    "RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal",
    "ParameterizedTruncatedNormal", "RandomGamma", "RandomPoisson", "RandomPoissonV2",
    "RandomShuffle", "RandomCrop", "Multinomial", "StatelessRandomUniform",
    "StatelessRandomUniformV2", "StatelessRandomUniformInt", "StatelessRandomUniformIntV2",
    "StatelessRandomUniformFullInt", "StatelessRandomUniformFullIntV2",
    "StatelessRandomNormal", "StatelessRandomNormalV2", "StatelessTruncatedNormal",
    "StatelessTruncatedNormalV2", "StatelessParameterizedTruncatedNormal",
    "StatelessMultinomial", "StatelessRandomBinomial", "StatelessRandomGammaV2",
    "StatelessRandomGammaV3", "StatelessRandomPoisson", "StatelessShuffle",
    "StatefulUniform", "StatefulUniformInt", "StatefulUniformFullInt",
    "StatefulStandardNormal", "StatefulStandardNormalV2", "StatefulTruncatedNormal",
    "RandomIndexShuffle",
})


@contextlib.contextmanager
def at_rate_zero() -> Iterator[Counter]:
    """Inside, the noise layers above pass their input through. Yields a Counter of
    what was silenced, by kind ('keras Dropout', 'tf.nn.dropout'), one per call."""
    silenced: Counter = Counter()
    with contextlib.ExitStack() as stack:
        for owner in _keras_noise_owners():
            stack.enter_context(_replaced(owner, "call", _keras_pass_through(owner, silenced)))
        for module, name in _tf_dropouts():
            stack.enter_context(_replaced(module, "dropout", _tf_pass_through(name, silenced)))
        yield silenced


def draws_in(losses: list[tf.Tensor]) -> list[str]:
    """The names of the random ops the `losses` depend on, in graph order."""
    seen: set[tf.Operation] = set()
    stack = [loss.op for loss in losses]
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    ops = losses[0].graph.get_operations() if losses else []
    return [op.name for op in ops if op in seen and op.type in RANDOM_OPS]


def _keras_noise_owners() -> list[type]:
    """The classes whose `call` each Keras noise layer runs (a base's, for the spatial
    dropouts), once each; none when the model never imported Keras."""
    keras = sys.modules.get("keras")
    if keras is None:
        return []
    owners: list[type] = []
    for name in KERAS_NOISE:
        cls = getattr(keras.layers, name, None)
        owner = next((k for k in getattr(cls, "__mro__", ()) if "call" in vars(k)), None)
        if owner is not None and owner not in owners:
            owners.append(owner)
    return owners


def _keras_pass_through(owner: type, silenced: Counter):
    def call(self, inputs, training=False):  # Keras reads the `training` argument's name
        if training:
            silenced[f"keras {type(self).__name__}"] += 1
        return inputs

    return call


def _tf_dropouts() -> list[tuple[object, str]]:
    return [(tf.nn, "tf.nn.dropout"), (tf.compat.v1.nn, "tf.compat.v1.nn.dropout"),
            (tf.compat.v2.nn, "tf.nn.dropout")]


def _tf_pass_through(name: str, silenced: Counter):
    def dropout(x, *args, **kwargs):
        silenced[name] += 1
        return tf.identity(x)

    return dropout


@contextlib.contextmanager
def _replaced(owner: object, attribute: str, value: object) -> Iterator[None]:
    before = vars(owner).get(attribute) if isinstance(owner, type) else getattr(owner, attribute)
    setattr(owner, attribute, value)
    try:
        yield
    finally:
        setattr(owner, attribute, before)
