"""Resolving model.name: built-ins, module:attribute from the user's files, builders'
parameters, declared inputs, and the user's own errors reported as theirs."""

import dataclasses
import itertools
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import cpu_session_config
from helpers.commands import run_in_process

import models
import towers
from launch import modelref
from launch.config import ConfigError, ModelConfig, load_job
from launch.modelref import ModelCodeError, ModelRefError

v1 = tf.compat.v1
_unique = itertools.count()

MODEL_FILE = '''
import keras
import tensorflow as tf
import towers


def model_fn(features, labels, ctx):
    w = tf.compat.v1.get_variable("w", [4, 3])
    return tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, tf.matmul(features, w))


def build(hidden=8, activation="relu"):
    net = keras.Sequential([keras.layers.Dense(hidden, activation=activation),
                            keras.layers.BatchNormalization(), keras.layers.Dense(3)])
    net.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"])
    return net


build.input_spec = {"feature_shape": [4], "num_classes": 3}


def needs_width(width):
    return model_fn


def broken(features, labels, ctx):
    w = tf.compat.v1.get_variable("w", [4, 3])
    if ctx.index == 1:
        return helper(w)
    return tf.reduce_sum(w)


def helper(w):
    raise RuntimeError("the model's own bug")


def returns_text():
    return "not a model"


def penalised(features, labels, ctx):
    """A loss in the compute type plus get_variable's float32 penalties."""
    w = tf.compat.v1.get_variable("w", [4, 3], regularizer=tf.nn.l2_loss)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, tf.matmul(features, w))
    return loss + tf.compat.v1.losses.get_regularization_loss()


def shared_keras():
    made_once.compile(loss="sparse_categorical_crossentropy")
    return made_once


CONFIG = {"width": 3}
made_once = keras.Sequential([keras.layers.Dense(3)])
'''


def user_module(tmp_path, text=MODEL_FILE):
    """A module of the user's own in tmp_path/code, under a name no test shares."""
    name = f"user_models_{next(_unique)}"
    folder = tmp_path / "code"
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.py").write_text(textwrap.dedent(text))
    return name, str(folder)


def resolve(name, job_dir=None, path=None, **params):
    return modelref.resolve(ModelConfig(name, params, path, job_dir))


def test_builtin_names_resolve_to_the_builtin_models():
    model = resolve("mlp", hidden_units=[4])
    assert model.source == "built-in" and model.params.hidden_units == (4,)


def test_a_builder_is_found_in_the_job_files_directory_with_its_defaults(tmp_path):
    name, folder = user_module(tmp_path)
    model = resolve(f"{name}:build", job_dir=folder, hidden=16)
    assert model.params == {"hidden": 16, "activation": "relu"}
    assert model.input_spec == models.InputSpec((4,), tf.float32, (), tf.int32, 3)
    assert model.source.endswith(f"{name}.py")
    text = modelref.describe(model)
    assert f"# model {name}:build: a builder in" in text and "hidden=16" in text


def test_model_path_is_searched_too(tmp_path):
    name, folder = user_module(tmp_path)
    assert resolve(f"{name}:model_fn", path=folder).input_spec is None
    with pytest.raises(ModelRefError, match="model.path: .* is not a directory") as info:
        resolve(f"{name}:model_fn", path=str(tmp_path / "nowhere"))
    assert info.value.param == "path"


@pytest.mark.parametrize("reference, params, says, param", [
    ("nowhere_at_all:build", {}, "no module named 'nowhere_at_all'", "name"),
    ("{m}:biuld", {}, "has no attribute 'biuld' (did you mean 'build'?)", "name"),
    ("{m}:CONFIG", {}, "is a dict, not callable", "name"),
    ("{m}:build", {"hiden": 3}, "takes no parameter 'hiden' (did you mean 'hidden'?); "
     "it takes: hidden, activation", "hiden"),
    ("{m}:needs_width", {}, "needs parameter(s) width", "name"),
    ("{m}:model_fn", {"width": 3}, "is a model function", "width"),
    ("{m}:made_once", {}, "is a Keras model object", "name"),
    ("resnet21", {}, "unknown model 'resnet21' (did you mean 'resnet20'?)", "name"),
])
def test_what_cannot_be_used_is_named(tmp_path, reference, params, says, param):
    name, folder = user_module(tmp_path)
    with pytest.raises(ModelRefError) as info:
        resolve(reference.format(m=name), job_dir=folder, **params)
    assert says in str(info.value)
    assert info.value.param == param


def test_a_models_code_may_import_its_siblings_when_it_is_called(tmp_path, graph):
    # As a script run with `python` may: the directories searched stay on sys.path,
    # after the installed packages, not only while the model's module is imported.
    sibling = f"user_layers_{next(_unique)}"
    name, folder = user_module(tmp_path, f"def build():\n    import {sibling}\n"
                                         f"    return {sibling}.model_fn\n")
    (tmp_path / "code" / f"{sibling}.py").write_text(textwrap.dedent(MODEL_FILE))
    model = resolve(f"{name}:build", job_dir=folder)
    assert sys.path[-1] == folder
    loss = model.model_fn(tf.zeros([4, 4]), tf.zeros([4], tf.int32),
                          towers.TowerContext(0, 1, "/cpu:0", True))
    assert loss.shape == ()


def test_load_job_blames_the_parameter_in_the_job_file(tmp_path):
    name, folder = user_module(tmp_path)
    job = tmp_path / "code" / "job.yaml"
    job.write_text(f"model: {{name: '{name}:build', hiden: 3}}\n")
    with pytest.raises(ConfigError) as info:
        load_job(str(job), check_model=modelref.check)
    assert (info.value.source, info.value.key) == (str(job), "model.hiden")


def test_a_bug_in_the_models_code_shows_its_frames_and_the_tower(tmp_path, graph):
    name, folder = user_module(tmp_path)
    model = resolve(f"{name}:broken", job_dir=folder)
    with pytest.raises(ModelCodeError) as info:
        towers.build_train_op(model.model_fn, tf.zeros([4, 4]), tf.zeros([4], tf.int32),
                              v1.train.GradientDescentOptimizer(0.1), ["/cpu:0", "/cpu:1"])
    message, details = str(info.value), info.value.details
    assert f"{name}:broken failed while building tower 1" in message
    assert "RuntimeError: the model's own bug" in message
    assert f"{name}.py" in details and "in helper" in details and "in broken" in details
    assert "towers/" not in details and "site-packages" not in details


def build_in(precision, model):
    with tf.Graph().as_default():
        towers.build_train_op(model.model_fn, tf.zeros([4, 4]), tf.zeros([4], tf.int32),
                              v1.train.GradientDescentOptimizer(0.1), ["/cpu:0"],
                              precision=precision)


def test_mixed_precision_mistakes_in_the_users_model_say_what_to_do(tmp_path):
    name, folder = user_module(tmp_path)
    build_in("float32", resolve(f"{name}:penalised", job_dir=folder))  # fine in float32
    with pytest.raises(ModelCodeError, match="TypeError.*the towers compute in bfloat16: "
                                             "compute the loss in float32"):
        build_in("mixed_bfloat16", resolve(f"{name}:penalised", job_dir=folder))
    with pytest.raises(ModelRefError, match="computes in float32 but the towers compute in "
                                            "bfloat16: make the model inside the builder"):
        build_in("mixed_bfloat16", resolve(f"{name}:shared_keras", job_dir=folder))


def test_a_module_failing_to_import_shows_its_frames(tmp_path):
    name, folder = user_module(tmp_path, "import math\n\nx = math.sqrt(-1)\n")
    with pytest.raises(ModelCodeError) as info:
        resolve(f"{name}:build", job_dir=folder)
    assert f"while importing {name}" in str(info.value)
    assert f"{name}.py\", line 3" in info.value.details


def test_a_module_that_does_not_compile_says_why_and_where(tmp_path):
    source = "import tensorflow as tf\n\n\ndef build():\n    return max(1,\n"
    name, folder = user_module(tmp_path, source)
    with pytest.raises(ModelCodeError) as info:
        resolve(f"{name}:build", job_dir=folder)
    line = str(info.value)
    assert f"while importing {name}: SyntaxError: " in line and "was never closed" in line
    assert f"{name}.py, line 5)" in line
    assert "<frozen" not in info.value.details  # Python's import machinery is not theirs
    assert f"{name}.py\", line 5" in info.value.details


def test_a_builder_returning_no_model_is_named(tmp_path, graph):
    name, folder = user_module(tmp_path)
    model = resolve(f"{name}:returns_text", job_dir=folder)
    with pytest.raises(ModelRefError, match="returned str; a builder returns"):
        model.model_fn(tf.zeros([4, 4]), tf.zeros([4], tf.int32),
                       towers.TowerContext(0, 1, "/cpu:0", True))


def test_a_keras_builder_trains_in_every_tower_and_updates_batch_norm_once(tmp_path):
    name, folder = user_module(tmp_path)
    model = resolve(f"{name}:build", job_dir=folder)
    keras.utils.clear_session()
    with tf.Graph().as_default():
        x = np.random.default_rng(0).normal(3.0, 1.0, (8, 4)).astype(np.float32)
        ops = towers.build_train_op(model.model_fn, tf.constant(x),
                                    tf.constant([0, 1, 2, 0, 1, 2, 0, 1]),
                                    v1.train.GradientDescentOptimizer(0.1), ["/cpu:0", "/cpu:1"],
                                    variable_update="replicated")
        assert model.model_fn.keras_model is not None
        saved = {v.op.name: v for v in v1.global_variables()}
        assert not any(n.startswith("tower_") for n in saved)
        # Every tower's moving statistics updates are collected; the builder runs tower 0's.
        updates = v1.get_collection(v1.GraphKeys.UPDATE_OPS, scope="tower_0/")
        assert len(updates) == 2
        with v1.Session(config=cpu_session_config(2)) as sess:
            sess.run(ops.init_op)
            sess.run(ops.train_op)
            mean = sess.run(saved["sequential/batch_normalization/moving_mean"])
    assert np.any(mean > 0)  # moved from its zero start by tower 0's update


def test_an_undeclared_input_is_read_from_npz_data(tmp_path):
    from launch.config import from_dict
    from launch.data import DataError
    from launch.runtime.plan import resolve_model

    name, folder = user_module(tmp_path)
    np.savez(tmp_path / "d.npz", features=np.zeros((5, 2, 2), np.float64),
             labels=np.array([0, 4, 1, 2, 0]))
    job = from_dict({"model": {"name": f"{name}:model_fn", "path": folder},
                     "data": {"source": "npz", "path": str(tmp_path / "d.npz")}})
    spec = resolve_model(job).input_spec
    assert spec == models.InputSpec((2, 2), tf.float32, (), tf.int32, 5)
    builtin = dataclasses.replace(job, data=from_dict({}).data)
    with pytest.raises(DataError, match="declares no input_spec and data.source builtin"):
        resolve_model(builtin)


FLOAT64_FILE = '''
import tensorflow as tf


def declared(features, labels, ctx):
    return tf.reduce_mean(features)


declared.input_spec = {"feature_shape": [4], "feature_dtype": "float64", "num_classes": 3}


def float64_weights(features, labels, ctx):
    w = tf.compat.v1.get_variable("w", [4, 3], tf.float64)
    return tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, tf.matmul(features, w))
'''


def test_a_model_declaring_float64_features_is_refused_in_one_line_naming_the_key(tmp_path):
    # towers trains in float32 (variables, checkpoints, the features cast at the towers'
    # edge): a float64 model would meet float32 features inside its first layer.
    name, folder = user_module(tmp_path, FLOAT64_FILE)
    np.savez(tmp_path / "d.npz", features=np.zeros((8, 4), np.float64),
             labels=np.arange(8) % 3)
    ckpt = tmp_path / "ckpt"
    result = run_in_process("train", "--set", f"model.name={name}:declared",
                            "--set", f"model.path={folder}", "--set", "data.source=npz",
                            "--set", f"data.path={tmp_path / 'd.npz'}",
                            "--set", f"train.checkpoint_dir={ckpt}")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"towers: error: <built-in job>: {name}:declared: its input_spec declares "
        "feature_dtype float64, which towers does not train in (towers.precision is float32 "
        "or a 16-bit mix, with float32 variables; float64 is towers verify's alone): "
        "declare feature_dtype float32 (float64 data are read as float32) and let the "
        "model's variables take the towers' type"]
    assert not ckpt.exists()


def test_a_model_making_float64_variables_is_told_the_features_are_float32(tmp_path):
    name, folder = user_module(tmp_path, FLOAT64_FILE)
    with pytest.raises(ModelCodeError, match="TypeError.*towers feeds float features as "
                                             "float32, towers.precision's type"):
        build_in("float32", resolve(f"{name}:float64_weights", job_dir=folder))
