"""keras.applications' models as a user would bring them: each a builder returning the
application, untrained (weights=None: nothing to download), at 32x32, compiled with a
loss and a metric.

EfficientNet and ResNetV2 are built by keras.applications' own builders
(EfficientNetB0 and ResNet50V2 call the same functions) at a shallower depth: every
kind of block they are made of is there, once or twice rather than up to six times,
which is what the comparison needs (the variables of a block repeated agree or not as
the block's first copy does); building the graph, not the steps, is what a deeper
model costs, twice over in `towers verify`.
"""

import keras
from keras.src.applications import efficientnet, resnet

INPUT = {"feature_shape": (32, 32, 3), "num_classes": 10}


def _compiled(net):
    net.compile(loss=keras.losses.SparseCategoricalCrossentropy(), metrics=["accuracy"])
    return net


def mobilenet_v2():
    return _compiled(keras.applications.MobileNetV2(input_shape=(32, 32, 3), weights=None,
                                                    classes=10))


def efficientnet_b0_half_depth():
    """EfficientNetB0 (width 1.0, dropout 0.2, stochastic depth 0.2) at depth coefficient
    0.5: its 7 stages of 1, 1, 1, 2, 2, 2, 1 blocks (B0: 1, 2, 2, 3, 3, 4, 1), so stages
    4 to 6 still repeat a block, with its residual add and stochastic-depth dropout."""
    return _compiled(efficientnet.EfficientNet(1.0, 0.5, 224, 0.2, name="efficientnet",
                                               input_shape=(32, 32, 3), weights=None,
                                               classes=10))


def resnet_v2_two_blocks_a_stack():
    """ResNet50V2's stacks (64, 128, 256, 512 filters; the last of stride 1) of 2
    pre-activation bottleneck blocks each (ResNet50V2: 3, 4, 6, 3): each stack's first
    block has its convolution shortcut, its second a max-pooled shortcut where it
    strides and the identity where it does not (conv5)."""
    def stack_fn(x):
        x = resnet.stack_residual_blocks_v2(x, 64, 2, name="conv2")
        x = resnet.stack_residual_blocks_v2(x, 128, 2, name="conv3")
        x = resnet.stack_residual_blocks_v2(x, 256, 2, name="conv4")
        return resnet.stack_residual_blocks_v2(x, 512, 2, stride1=1, name="conv5")

    return _compiled(resnet.ResNet(stack_fn, True, True, name="resnet_v2",
                                   input_shape=(32, 32, 3), weights=None, classes=10))


for _build in (mobilenet_v2, efficientnet_b0_half_depth, resnet_v2_two_blocks_a_stack):
    _build.input_spec = INPUT
