"""Model code in the style of code written elsewhere, each through `towers verify` at 2
towers with towers.batch_norm: sync for 5 steps (tests/launch/verify/corpus):

  cifar_style        a TF1 model function as TensorFlow's classic CIFAR-10 tutorial
                     wrote one: weight decay in the 'losses' collection summed with
                     add_n, local response normalization, an exponential moving average
                     of the weights in UPDATE_OPS, summaries inside the model;
  keras.applications MobileNetV2, EfficientNet (its stochastic depth and dropout at
                     rate 0) and ResNetV2 at 32x32, weights=None, as Keras builders
                     (EfficientNetB0 and ResNet50V2 by keras.applications' own
                     builders at a shallower depth, every kind of block kept).

Each must pass, every variable within max(1e-9 x max|w|, 10 x its float64 noise floor),
and every variable must have moved (the weights, their momentum, the batch norms'
moving statistics, the moving averages), or agreement would show nothing; only the
seed state of a dropout held at rate 0, and EfficientNet's input normalization (set by
adapt(), not trained), may stand still. The Keras models' batch norms
must be synchronized (no warning that nothing was). The runs share this process
(the command's own main(), as the command runs it), batches of 8 generated images.
"""

import os

import pytest
from helpers.commands import run_in_process

pytestmark = pytest.mark.e2e

CORPUS = os.path.join(os.path.dirname(__file__), "corpus")
JOB = {"model.path": CORPUS, "data.source": "builtin", "data.num_examples": 64,
       "train.batch_size": 8, "towers.devices": 2, "towers.batch_norm": "sync",
       "optimizer.learning_rate": 0.01}
NOTHING_SYNCHRONIZED = "the model computed no statistic across the towers"
# What training leaves as it is: a Keras Dropout's seed generator (its state advances
# only when it draws), EfficientNet's input Normalization (statistics set by adapt()).
STILL = ("seed_generator", "normalization/")

MODELS = [
    "cifar_style:model_fn",
    "keras_applications:mobilenet_v2",
    "keras_applications:efficientnet_b0_half_depth",
    "keras_applications:resnet_v2_two_blocks_a_stack",
]


def verify(model: str):
    settings = [arg for key, value in {**JOB, "model.name": model}.items()
                for arg in ("--set", f"{key}={value}")]
    return run_in_process("verify", *settings)


@pytest.mark.parametrize("model", MODELS)
def test_model_code_from_elsewhere_trains_on_two_towers_as_on_one_device(model):
    result = verify(model)
    lines = result.stdout.splitlines()
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert lines[-1].startswith("pass: 2 towers against one device after 5 steps"), lines[-1]
    unchanged = [line for line in lines if line.startswith("# unchanged by the steps")]
    if unchanged:
        names = unchanged[0].split(": ", 1)[1].split(", ")
        assert all(name.startswith(STILL) for name in names), unchanged[0]
    if model.startswith("keras_applications"):
        assert NOTHING_SYNCHRONIZED not in result.stderr
