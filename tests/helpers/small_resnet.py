"""A ResNet-8 for tests that compare two ways of training a conv model: resnet20's own
code (models.resnet) with one block per stage instead of three, on 8x8 images with 2
filters in the first stage. Its convolutions, batch norm and weight decay are all there,
in about a third of resnet20's graph, which is what building and tracing it cost."""

import models
from models import resnet


def resnet8() -> models.Model:
    """Features float32 [batch, 8, 8, 3], labels int32 [batch] (10 classes); 23
    trainable variables."""
    params = resnet.Params(image_size=8, base_filters=2)
    return models.Model("resnet8", params, resnet.build_model_fn(params, depth=8),
                        params.input_spec(), source="tests/helpers/small_resnet.py")
