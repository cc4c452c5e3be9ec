"""What models/keras_model.py takes from Keras' private parts is still there, in the
shape it reads it: a Keras release that changes one fails here, naming the installed
Keras and the supported range (setup.cfg)."""

import inspect

import keras
import pytest

from models import keras_model

SUPPORTED = ">=3.12,<3.16"  # setup.cfg's


def problem(what: str) -> str:
    return f"Keras {keras.__version__}: {what}; towers supports Keras {SUPPORTED}"


def test_layer_names_restart_through_reset_uids():
    from keras.src.utils import naming

    function = getattr(naming, "reset_uids", None)
    assert callable(function), problem("keras.src.utils.naming.reset_uids is gone (models/"
                                       "keras_model.reset_names restarts layer names with it)")
    assert not inspect.signature(function).parameters, problem(
        "keras.src.utils.naming.reset_uids now takes parameters")
    keras.layers.Dense(1)
    keras_model.reset_names()
    assert keras.layers.Dense(1).name == "dense", problem("reset_uids no longer restarts names")


@pytest.mark.parametrize("metric", ["accuracy", keras.metrics.SparseCategoricalAccuracy()],
                         ids=["by_name", "mean_metric"])
def test_compiled_metrics_are_read_where_keras_keeps_them(metric):
    # compile()'s metrics as given (model._compile_config.config), and a mean metric's
    # per-example function (MeanMetricWrapper's _fn and _fn_kwargs).
    net = keras.Sequential([keras.layers.Dense(3)])
    net.compile(loss="sparse_categorical_crossentropy", metrics=[metric])
    config = getattr(getattr(net, "_compile_config", None), "config", None)
    assert isinstance(config, dict) and config.get("metrics") == [metric], problem(
        "a compiled model no longer keeps its metrics in _compile_config.config")
    if not isinstance(metric, str):
        assert callable(getattr(metric, "_fn", None)) and isinstance(
            getattr(metric, "_fn_kwargs", None), dict), problem(
            "a mean metric no longer keeps its function in _fn and _fn_kwargs")
    assert len(keras_model.compiled_metrics(net)) == 1


def test_batch_norm_moments_are_asked_for_where_towers_synchronizes_them():
    # towers/keras_sync.py: BatchNormalization._moments(inputs, mask) asks for
    # synchronized moments when the layer's `synchronized` is set, through the TensorFlow
    # backend's _compute_moments_sync.
    from keras.src.backend.tensorflow import nn
    from keras.src.layers.normalization import batch_normalization

    moments = getattr(batch_normalization.BatchNormalization, "_moments", None)
    assert callable(moments) and list(inspect.signature(moments).parameters) == [
        "self", "inputs", "mask"], problem("BatchNormalization._moments(inputs, mask) is gone")
    assert "self.synchronized" in inspect.getsource(moments), problem(
        "BatchNormalization._moments no longer reads self.synchronized")
    assert callable(getattr(nn, "_compute_moments_sync", None)), problem(
        "keras.src.backend.tensorflow.nn._compute_moments_sync is gone")
