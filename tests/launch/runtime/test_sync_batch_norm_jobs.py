"""towers.batch_norm and the towers' randomness in whole `towers train` jobs, run in
this process: a checkpoint directory resumes when the job switches between local and
sync batch norm, a ps/worker job refuses sync with one line, and a Keras job with
dropout repeats for a fixed seed."""

import re

import numpy as np
import pytest
import tensorflow as tf

from launch.config import ConfigError, from_dict
from launch.runtime.train import train

# A small conv net whose batch norm sums its statistics across the towers when asked
# (as the built-in ResNet's do: tests/towers/test_sync_batch_norm.py); a whole resnet20
# job costs ten times as much to build for the same check.
BN_MODEL = '''
import tensorflow as tf
from models import layers


def model_fn(features, labels, ctx):
    x = layers.conv2d(features, 4, 3, scope="conv")
    x = layers.batch_norm(x, ctx.is_training, scope="bn", across=ctx.batch_sum)
    logits = layers.dense(layers.global_avg_pool(tf.nn.relu(x)), 3, scope="logits")
    return layers.softmax_cross_entropy(logits, labels)


model_fn.input_spec = {"feature_shape": (8, 8, 3), "num_classes": 3}
'''
BN_JOB = {"data": {"source": "synthetic", "num_examples": 64}, "towers": {"devices": 2}}


def run(ckpt, steps, batch_norm, lines):
    raw = {**BN_JOB, "model": {"name": "bn_model:model_fn", "path": str(ckpt.parent)},
           "towers": {**BN_JOB["towers"], "batch_norm": batch_norm},
           "train": {"batch_size": 8, "steps": steps, "log_every_steps": 2,
                     "checkpoint_dir": str(ckpt)}}
    return train(from_dict(raw), write=lines.append)


def test_a_sync_jobs_checkpoint_resumes_with_local_batch_norm(tmp_path):
    # The variables are the same either way (tests/towers/test_sync_batch_norm.py), so
    # one switch stands for both directions.
    (tmp_path / "bn_model.py").write_text(BN_MODEL)
    for steps, batch_norm in [(2, "sync"), (4, "local")]:
        lines = []
        result = run(tmp_path / "ckpt", steps, batch_norm, lines)
        assert (result["global_step"], result["steps_run"]) == (steps, 2)
        synchronized = "1 batch norm(s) synchronized over the global batch" in lines[0]
        assert synchronized == (batch_norm == "sync"), lines[0]


KERAS_BN_MODEL = '''
import keras

def build():
    net = keras.Sequential([keras.layers.Conv2D(4, 3), keras.layers.BatchNormalization(),
                            keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3)])
    net.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return net

build.input_spec = {"feature_shape": (8, 8, 3), "num_classes": 3}
'''


def test_sync_synchronizes_a_keras_models_plain_batch_norm_and_says_so(tmp_path):
    (tmp_path / "keras_bn.py").write_text(KERAS_BN_MODEL)
    raw = {**BN_JOB, "model": {"name": "keras_bn:build", "path": str(tmp_path)},
           "towers": {**BN_JOB["towers"], "batch_norm": "sync"},
           "train": {"batch_size": 8, "steps": 1, "checkpoint_dir": str(tmp_path / "c")}}
    lines = []
    train(from_dict(raw), write=lines.append)
    start = next(line for line in lines if line.startswith("model keras_bn:build"))
    assert "1 batch norm(s) synchronized over the global batch" in start, start
    assert not [line for line in lines if line.startswith("warning: ")], lines


def test_a_ps_worker_job_refuses_sync_batch_norm_naming_the_key():
    raw = {"model": {"name": "resnet20"}, "towers": {"devices": 2, "batch_norm": "sync"}}
    with pytest.raises(ConfigError) as raised:
        from_dict(raw, arrangement=lambda job: "ps_worker")
    assert raised.value.key == "towers.batch_norm"
    assert re.match(r"^sync is not available in ps/worker jobs.*use local, or --backend horovod",
                    raised.value.message)


KERAS_MODEL = '''
import keras

def build():
    net = keras.Sequential([keras.layers.Dense(16, activation="relu"),
                            keras.layers.Dropout(0.5), keras.layers.Dense(2)])
    net.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return net

build.input_spec = {"feature_shape": (8,), "num_classes": 2}
'''


def test_a_keras_job_with_dropout_repeats_for_a_fixed_seed(tmp_path):
    # Keras draws its layers' seeds (dropout, initial weights) from Python's generator:
    # the job seeds it with train.seed, so two runs save the same variables.
    (tmp_path / "dropout_model.py").write_text(KERAS_MODEL)
    saved = []
    for run_dir in ("a", "b"):
        raw = {"model": {"name": "dropout_model:build", "path": str(tmp_path)},
               "data": {"source": "synthetic"}, "towers": {"devices": 2},
               "train": {"batch_size": 8, "steps": 3, "checkpoint_dir": str(tmp_path / run_dir)}}
        train(from_dict(raw), write=lambda line: None)
        reader = tf.train.load_checkpoint(str(tmp_path / run_dir))
        saved.append({n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()})
    assert saved[0].keys() == saved[1].keys()
    for name in saved[0]:
        np.testing.assert_array_equal(saved[0][name], saved[1][name], err_msg=name)


def test_sync_batch_norm_that_synchronized_nothing_is_a_warning_line_naming_the_setting(
        tmp_path, recwarn):
    """An MLP has no batch norm: the library's warning reaches the user as one line in the
    job file's terms, not as a Python UserWarning with its source line on stderr."""
    lines = []
    raw = {"model": {"name": "mlp", "input_dim": 8, "hidden_units": [8], "num_classes": 2},
           "data": {"source": "synthetic", "num_examples": 64},
           "towers": {"devices": 2, "batch_norm": "sync"},
           "train": {"batch_size": 8, "steps": 1, "checkpoint_dir": str(tmp_path)}}
    train(from_dict(raw), write=lines.append)
    warned = [line for line in lines if line.startswith("warning: ")]
    assert warned == [
        "warning: towers.batch_norm: sync: the model computed no statistic across the towers, "
        "so its batch norms, if any, normalize by each tower's own shard; compute their "
        "moments with ctx.batch_moments (Keras' BatchNormalization layers are synchronized "
        "already), or set towers.batch_norm: local"], lines
    start = next(line for line in lines if line.startswith("model mlp"))
    assert "synchronized" not in start, start  # the start-up line does not claim it
    assert not [w for w in recwarn if "batch_norm" in str(w.message)]
