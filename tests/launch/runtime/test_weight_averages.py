"""State updates and weight averages through the job: `towers train` runs every state
update a model makes, of every form, once a step (it ran none in a tf.group: an
ExponentialMovingAverage in UPDATE_OPS never moved); train.moving_average_decay keeps
averages that equal one device's, resume exactly, and `towers eval/export --averages`
score and serve."""

import textwrap

import numpy as np
import pytest
import tensorflow as tf
from helpers.data_files import write_four_class_npz

import towers
from launch.config import ConfigError, from_dict, load_job
from launch.runtime.checkpoints import CheckpointError
from launch.runtime.evaluate import evaluate
from launch.runtime.export import export
from launch.runtime.train import train

QUIET = lambda line: None  # noqa: E731
WEIGHTS = "mlp/hidden0/kernel"
AVERAGE = f"{WEIGHTS}/{towers.AVERAGE_NAME}"

# A model function written the way TensorFlow's classic CIFAR-10 tutorial writes its
# model: weight decay added to a 'losses' collection, the loss their sum, an
# ExponentialMovingAverage of the weights in UPDATE_OPS; and counters of other forms.
TUTORIAL_STYLE = '''
import tensorflow as tf

v1 = tf.compat.v1


def counter(name):
    return v1.get_variable(name, [], trainable=False, initializer=tf.zeros_initializer())


def model_fn(features, labels, ctx):
    weights = v1.get_variable("weights", [16, 4], initializer=v1.glorot_uniform_initializer())
    v1.add_to_collection("losses", 1e-3 * tf.nn.l2_loss(weights))
    logits = tf.matmul(features, weights)
    v1.add_to_collection("losses", tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)))
    averages = v1.train.ExponentialMovingAverage(0.9)
    v1.add_to_collection(v1.GraphKeys.UPDATE_OPS, averages.apply(v1.trainable_variables()))
    v1.add_to_collection(v1.GraphKeys.UPDATE_OPS, counter("in_update_ops").assign_add(1.0))
    v1.add_to_collection(v1.GraphKeys.UPDATE_OPS, tf.group(counter("grouped").assign_add(1.0)))
    tf.group(counter("in_no_collection").assign_add(1.0))
    return tf.add_n(v1.get_collection("losses"))


model_fn.input_spec = {"feature_shape": (16,), "num_classes": 4}
'''


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    work = tmp_path_factory.mktemp("averages")
    write_four_class_npz(work / "d.npz")
    (work / "tutorial_style.py").write_text(textwrap.dedent(TUTORIAL_STYLE))
    return work


def job(work, name, steps, devices=2, **train_section):
    return {"model": {"name": "mlp", "input_dim": 16, "hidden_units": [8], "num_classes": 4},
            "data": {"source": "npz", "path": str(work / "d.npz")},
            "towers": {"devices": devices},
            "optimizer": {"learning_rate": 0.2},
            "train": {"batch_size": 32, "steps": steps, "checkpoint_every_steps": None,
                      "checkpoint_dir": str(work / name), **train_section},
            "eval": {"batch_size": 32}}


def stored(directory):
    reader = tf.train.load_checkpoint(str(directory))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def checkpoints_by_step(directory):
    state = tf.train.get_checkpoint_state(str(directory))
    values = [stored(path) for path in state.all_model_checkpoint_paths]
    return {int(v["global_step"]): v for v in values}


@pytest.mark.parametrize("on_nonfinite", ["stop", "skip"])
def test_train_runs_every_state_update_a_tutorial_style_model_makes(data, on_nonfinite):
    # A checkpoint after every step: each holds what the steps so far made.
    raw = job(data, f"tutorial_{on_nonfinite}", steps=3, on_nonfinite=on_nonfinite,
              checkpoint_every_steps=1)
    raw["model"] = {"name": "tutorial_style:model_fn", "path": str(data)}
    train(from_dict(raw), write=QUIET)
    saved = checkpoints_by_step(data / f"tutorial_{on_nonfinite}")
    assert sorted(saved) == [0, 1, 2, 3]
    for step, values in saved.items():
        for count in ("in_update_ops", "grouped", "in_no_collection"):
            assert values[count] == step, (count, step)
    # The tutorial's average after step t holds the weights before it, once.
    for step in (1, 2, 3):
        before, after = saved[step - 1], saved[step]
        want = 0.9 * before["weights/ExponentialMovingAverage"] + 0.1 * before["weights"]
        np.testing.assert_allclose(after["weights/ExponentialMovingAverage"], want,
                                   atol=1e-7, rtol=0, err_msg=f"after step {step}")
    assert np.abs(saved[3]["weights"] - saved[0]["weights"]).max() > 1e-3  # the weights moved


def test_weight_averages_equal_one_device_and_resume_exactly(data):
    decay = {"moving_average_decay": 0.9}
    train(from_dict(job(data, "one", steps=6, devices=1, **decay)), write=QUIET)
    train(from_dict(job(data, "resumed", steps=3, **decay)), write=QUIET)
    train(from_dict(job(data, "resumed", steps=6, **decay)), write=QUIET)  # resumes at 3
    one, resumed = stored(data / "one"), stored(data / "resumed")
    assert resumed["global_step"] == 6
    np.testing.assert_allclose(resumed[AVERAGE], one[AVERAGE], atol=1e-6, rtol=0)
    assert np.abs(one[AVERAGE] - one[WEIGHTS]).max() > 1e-4  # an average, not a copy


def test_eval_and_export_use_the_averages_when_asked(data):
    raw = job(data, "scored", steps=6, moving_average_decay=0.9)
    train(from_dict(raw), write=QUIET)
    weights = evaluate(from_dict(raw), write=QUIET)
    averaged = evaluate(from_dict(raw), write=QUIET, averages=True)
    assert averaged["averages"] is True and averaged["loss"] != weights["loss"]
    export(from_dict(raw), str(data / "served"), write=QUIET, averages=True)
    served = stored(data / "served" / "variables" / "variables")
    assert WEIGHTS in served
    np.testing.assert_array_equal(served[WEIGHTS], stored(data / "scored")[AVERAGE])


def test_averages_asked_of_a_checkpoint_without_them_is_one_line(data):
    raw = job(data, "plain", steps=2)
    train(from_dict(raw), write=QUIET)
    with pytest.raises(CheckpointError, match="holds no weight averages") as raised:
        evaluate(from_dict(raw), write=QUIET, averages=True)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("decay", ["0", "1", "1.5"])
def test_a_decay_outside_0_to_1_is_refused(decay):
    with pytest.raises(ConfigError, match="train.moving_average_decay"):
        load_job(None, [f"train.moving_average_decay={decay}"])
