"""A ResNet-8 for tests that compare two ways of training a conv model: resnet20's own
code (models.resnet) with one block per stage instead of three, on 8x8 images with 2
filters in the first stage. Its convolutions, batch norm and weight decay are all there,
in about a third of resnet20's graph, which is what building and tracing it cost.

`resnet8` is the model as a test in this process takes it; `build` is the same model as
a job names a model of its own (model.path: tests/helpers, model.name:
small_resnet:build), for the tests that train it with towers commands."""

import models
import towers
from models import resnet

PARAMS = resnet.Params(image_size=8, base_filters=2)


def resnet8() -> models.Model:
    """Features float32 [batch, 8, 8, 3], labels int32 [batch] (10 classes); 23
    trainable variables."""
    return models.Model("resnet8", PARAMS, build(), PARAMS.input_spec(),
                        source="tests/helpers/small_resnet.py")


def build() -> towers.ModelFn:
    """resnet8's model function: its variables under `resnet8/`."""
    return resnet.build_model_fn(PARAMS, depth=8)


build.input_spec = PARAMS.input_spec()
