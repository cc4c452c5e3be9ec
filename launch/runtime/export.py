"""`towers export`: a SavedModel for serving, from a checkpoint of the job's model.

The model is built once more, as for evaluation but with one tower on the CPU and
no optimizer, global step or gradients; the checkpoint is restored into it and
written with one signature, `serving_default`: `features` [batch, *feature_shape]
to `predictions` (what the model returns as TowerOutputs.predictions: class
probabilities for the built-in classifiers and compiled Keras classifiers).
TensorFlow Serving and `tf.saved_model.load` read it; device placements are
cleared, so it serves on any device. The graph computes in float32 whatever
`towers.precision` the job trained in: checkpoints are float32 in every precision,
and a served model should not depend on the trainer's number type.

For a builder returning a Keras model, DIR/model.weights.h5 is written too: the
model is built again eagerly, as the user's own code would build it, given the
checkpoint's values and saved with `save_weights`, so `build(...).load_weights(path)`
gets them back. That runs in a fresh process: towers commands turn eager execution
off for good, and Keras writes weights files only from eager values.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import tensorflow as tf

import towers
from launch.config import JobConfig, ModelConfig
from launch.errors import BadInput
from launch.log import _import_tensorflow_quietly, log
from launch.modelref.user import thaw
from launch.runtime import checkpoints, weight_averages
from launch.runtime.plan import make_plan

V1 = tf.compat.v1
SIGNATURE = "serving_default"
KERAS_WEIGHTS = "model.weights.h5"


class ExportError(BadInput):
    """The export cannot be written as asked (its directory exists, no predictions...)."""


def export(job: JobConfig, out: str, checkpoint: str | None = None,
           write: Callable[[str], None] = log, averages: bool = False) -> dict:
    """Write the SavedModel (and Keras weights) to `out`; returns what was written.
    averages: the checkpoint's weight averages (train.moving_average_decay) as the
    weights."""
    plan = make_plan(job)
    train_dir = job.train.checkpoint_dir
    path = checkpoints.resolve(checkpoint or train_dir,
                               "--checkpoint" if checkpoint else "train.checkpoint_dir")
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise ExportError(f"--out: {out} exists; give a new directory (a SavedModel is "
                          f"written whole, never into an existing one)")
    spec = plan.model.input_spec
    graph = tf.Graph()
    with graph.as_default():
        features = V1.placeholder(spec.feature_dtype, [None, *spec.feature_shape],
                                  name="features")
        ops = towers.build_eval_ops(plan.model.model_fn, features, _no_labels(features, spec),
                                    ["/cpu:0"], param_device="/cpu:0")
        if ops.predictions is None:
            raise ExportError(
                f"model {plan.model.name} returns no predictions to serve: return "
                f"towers.TowerOutputs(loss, metrics, predictions=...) from its model function"
            )
        _check_restorable(path)
        if averages:
            weight_averages.check_averages(path)
        keras = getattr(plan.model.model_fn, "keras_model", None)
        with V1.Session(graph=graph, config=plan.session) as sess:
            weight_averages.model_saver(averages).restore(sess, path)
            builder = V1.saved_model.Builder(out)
            signature = V1.saved_model.predict_signature_def(
                {"features": features}, {"predictions": ops.predictions})
            builder.add_meta_graph_and_variables(
                sess, [tf.saved_model.SERVING], signature_def_map={SIGNATURE: signature},
                clear_devices=True, strip_default_attrs=True)
            values = sess.run([w.value for w in keras.weights]) if keras is not None else None
        builder.save()
    weights = None
    if values is not None:
        weights = os.path.join(out, KERAS_WEIGHTS)
        _write_keras_weights(job.model, values, spec, weights)
    write(f"exported {path} to {out}" + (f" and {weights}" if weights else ""))
    return {
        "saved_model": out,
        "checkpoint": path,
        "global_step": checkpoints.step_of(path),
        "signature": SIGNATURE,
        "inputs": {"features": [None, *spec.feature_shape]},
        "outputs": {"predictions": ops.predictions.shape.as_list()},
        "keras_weights": weights,
        "averages": averages,
    }


def _no_labels(features: tf.Tensor, spec) -> tf.Tensor:
    """Zeros as labels: the model function takes labels, serving has none, and the loss
    they feed is not part of the signature (nothing serving runs depends on it)."""
    shape = tf.concat([tf.shape(features)[:1], tf.constant(spec.label_shape, tf.int32)], 0)
    return tf.zeros(shape, spec.label_dtype, name="no_labels")


def _check_restorable(path: str) -> None:
    stored = tf.train.load_checkpoint(path).get_variable_to_shape_map()
    missing = [v.op.name for v in V1.global_variables() if v.op.name not in stored]
    if missing:
        raise ExportError(f"--checkpoint: {path} was written by a different model; missing: "
                          f"{', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''}")


def _write_keras_weights(model: ModelConfig, values: list[np.ndarray], spec,
                         path: str) -> None:
    """Build the model in a fresh, eager process, give it `values` and save them."""
    context = multiprocessing.get_context("spawn")
    params = {k: thaw(v) for k, v in model.params.items()}
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        problem = pool.submit(
            _save_weights_eagerly, model.name, params, model.path, model.job_dir, values,
            spec.feature_shape, spec.feature_dtype.name, path,
        ).result()
    if problem:
        raise ExportError(f"{path}: cannot write the Keras weights: {problem}")


def _save_weights_eagerly(name, params, model_path, job_dir, values, feature_shape,
                          feature_dtype, path) -> str | None:
    """In the fresh process: None when written, else what went wrong (one line)."""
    try:
        _import_tensorflow_quietly()  # eager: this process never turns it off
        from launch import modelref
        from models import keras_model

        fn = modelref.resolve(ModelConfig(name, params, model_path, job_dir)).model_fn
        keras_model.reset_names()
        made = fn.found.value(**fn.params)
        made(np.zeros((1, *feature_shape), feature_dtype))  # makes its variables
        made.set_weights(values)
        made.save_weights(path)
    except Exception as err:  # reported by the parent as one line
        return f"{type(err).__name__}: {err}".splitlines()[0]
    return None
