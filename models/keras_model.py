"""Keras 3 models as tower model functions: a compiled model's loss and metrics per tower.

    net = keras.Sequential([...])
    net.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"])
    outputs = tower_outputs(net, features, labels, ctx)   # towers.TowerOutputs

The loss and the metric names come from `compile`; its optimizer is not used (the
job's optimizer trains every tower). Keras is imported only by the user's code: this
module looks it up in `sys.modules`, so importing it costs nothing for other models.

Graph mode needs two things Keras does by itself only in TF2 functions: its state
updates (batch-norm moving statistics, dropout seeds) are assignments nothing runs in
a v1 graph, which the tower builder runs for tower 0 (towers.state_updates); and
auto-generated layer names grow with every model made in a process (`dense`,
`dense_1`, ...): `reset_names` restarts them, so each graph names its variables, and
so its checkpoints, the same way.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from towers import TowerContext, TowerOutputs

_ACCURACY = ("accuracy", "acc")

MetricFn = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]


class KerasModelError(ValueError):
    """A Keras model towers cannot train as it is (not compiled, an unsupported loss...)."""


def is_keras_model(value: Any) -> bool:
    """True for a keras.Model instance (Keras already imported by the caller's code)."""
    keras = sys.modules.get("keras")
    return keras is not None and isinstance(value, keras.Model)


def is_keras_object(value: Any) -> bool:
    """True for any Keras layer or model instance."""
    keras = sys.modules.get("keras")
    return keras is not None and isinstance(value, keras.layers.Layer)


def reset_names() -> None:
    """Restart Keras's automatic layer names (`dense`, `dense_1`, ...) for a new graph.

    keras.utils.clear_session() would do it, but it also resets TensorFlow's default
    graph, which fails inside the graph being built.
    """
    naming = sys.modules.get("keras.src.utils.naming")
    if naming is not None and hasattr(naming, "reset_uids"):
        naming.reset_uids()


def tower_outputs(net, features: tf.Tensor, labels: tf.Tensor,
                  ctx: TowerContext) -> TowerOutputs:
    """Call `net` on this tower's features; its compiled loss (plus `net.losses`, the
    layers' regularization penalties), metrics and predictions.

    features: [B, ...] as the model takes them; labels: [B, ...] as its loss takes them.
    predictions: the model's outputs, as class probabilities when the loss reads
    logits (`from_logits=True`): softmax over the last axis (sigmoid for one unit).
    """
    loss_fn, from_logits = compiled_loss(net)
    metric_fns = compiled_metrics(net)
    check_compute_dtype(net, ctx)
    outputs = net(features, training=ctx.is_training)
    if not isinstance(outputs, tf.Tensor):
        raise KerasModelError(
            f"the Keras model returns {type(outputs).__name__}; towers trains models with "
            f"one output tensor"
        )
    loss = tf.reduce_mean(loss_fn(labels, outputs))
    penalties = list(net.losses)
    if penalties:
        loss += tf.add_n([tf.cast(p, loss.dtype) for p in penalties])
    metrics = {
        name: tf.reduce_mean(tf.cast(fn(labels, outputs), tf.float32))
        for name, fn in metric_fns.items()
    }
    forget_compile_state(net)
    return TowerOutputs(loss, metrics, _probabilities(outputs) if from_logits else outputs)


def check_compute_dtype(net, ctx: TowerContext) -> None:
    """The model computes in the tower's type: towers makes Keras layers with the dtype
    policy of towers.precision, so only a model made outside the towers (or with a
    dtype of its own) can differ; training it would silently compute in another type."""
    computes = getattr(net.dtype_policy, "compute_dtype", None)
    if computes is not None and computes != ctx.compute_dtype.name:
        raise KerasModelError(
            f"the Keras model computes in {computes} but the towers compute in "
            f"{ctx.compute_dtype.name}: make the model inside the builder or model function "
            f"(towers then gives its layers Keras' policy for towers.precision) and give it "
            f"no dtype of its own"
        )


def forget_compile_state(net) -> None:
    """Take the variables `compile` made for Keras' own training loop (its optimizer's
    step and learning rate, the loss tracker) out of GLOBAL_VARIABLES: nothing here
    reads them, so checkpoints and initialisers need not carry them."""
    optimizer = getattr(net, "optimizer", None)
    unused = [*getattr(optimizer, "variables", []), *getattr(net, "metrics_variables", [])]
    ids = {id(getattr(v, "value", v)) for v in unused}
    collection = tf.compat.v1.get_collection_ref(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
    collection[:] = [v for v in collection if id(v) not in ids]


def compiled_loss(net) -> tuple[MetricFn, bool]:
    """The loss given to `net.compile` as a function (labels, outputs) -> values (per
    example or their mean), and whether it reads logits."""
    keras = sys.modules["keras"]
    loss = getattr(net, "loss", None)
    if loss is None:
        raise KerasModelError(
            "the Keras model is not compiled with a loss: call "
            "model.compile(loss=..., metrics=[...]) before returning it (towers uses the "
            "loss and metrics; the job's optimizer section trains it)"
        )
    if isinstance(loss, str):
        loss = keras.losses.get(loss)
    if isinstance(loss, keras.losses.Loss):
        config = loss.get_config()
        if config.get("reduction") not in ("sum_over_batch_size", None):
            raise KerasModelError(
                f"the Keras loss {config.get('name')} has reduction "
                f"{config.get('reduction')!r}; towers needs the mean over the examples "
                f"(the default, 'sum_over_batch_size')"
            )
        return loss, bool(config.get("from_logits", False))
    if callable(loss):
        return loss, False
    raise KerasModelError(
        f"the Keras model's loss is {type(loss).__name__}; towers takes one loss: a name, "
        f"a keras.losses.Loss or a function (y_true, y_pred) -> values"
    )


def compiled_metrics(net) -> dict[str, MetricFn]:
    """The metrics given to `net.compile`, each as a function (labels, outputs) -> values.

    Accepted: 'accuracy' (class-id labels against class scores), the names of Keras'
    metric functions ('sparse_top_k_categorical_accuracy', ...), functions, and
    Keras mean metrics (keras.metrics.SparseCategoricalAccuracy(), ...). Stateful
    metrics that are not means (AUC, Precision) are refused: towers averages each
    metric over a tower's examples, then across towers.
    """
    # Keras keeps what compile() was given only here; get_compile_config() returns
    # it serialized, which loses the user's own functions.
    config = getattr(getattr(net, "_compile_config", None), "config", None) or {}
    given = config.get("metrics") or []
    if isinstance(given, dict):
        raise KerasModelError("towers trains models with one output: give metrics as a list")
    metrics: dict[str, MetricFn] = {}
    for metric in given:
        name, fn = _metric(metric)
        metrics[name] = fn
    return metrics


def _metric(metric: Any) -> tuple[str, MetricFn]:
    keras = sys.modules["keras"]
    if isinstance(metric, str):
        if metric in _ACCURACY:
            return "accuracy", _sparse_accuracy
        fn = getattr(keras.metrics, metric, None)
        if fn is None or isinstance(fn, type) or not callable(fn):
            raise KerasModelError(
                f"metric {metric!r}: give 'accuracy', the name of a Keras metric function "
                f"(e.g. 'sparse_top_k_categorical_accuracy'), a function or a Keras mean metric"
            )
        return metric, fn
    if isinstance(metric, keras.metrics.Metric):
        fn = getattr(metric, "_fn", None)  # MeanMetricWrapper's per-example function
        if fn is None:
            raise KerasModelError(
                f"metric {metric.name}: {type(metric).__name__} is not a mean of per-example "
                f"values; towers averages metrics across towers, so it takes mean metrics "
                f"and functions (y_true, y_pred) -> values"
            )
        kwargs = dict(getattr(metric, "_fn_kwargs", {}))
        return metric.name, lambda y_true, y_pred: fn(y_true, y_pred, **kwargs)
    if callable(metric):
        return getattr(metric, "__name__", type(metric).__name__), metric
    raise KerasModelError(f"metric {metric!r} is neither a name nor a function")


def _sparse_accuracy(labels: tf.Tensor, outputs: tf.Tensor) -> tf.Tensor:
    """1.0 where the highest-scoring class is the label; labels [B, ...], outputs [B, ..., K]."""
    predicted = tf.argmax(outputs, axis=-1, output_type=tf.int64)
    return tf.cast(tf.equal(predicted, tf.cast(labels, tf.int64)), tf.float32)


def _probabilities(logits: tf.Tensor) -> tf.Tensor:
    if logits.shape.rank and logits.shape[-1] == 1:
        return tf.sigmoid(logits, name="probabilities")
    return tf.nn.softmax(logits, name="probabilities")
