"""keras.applications' models as a user would bring them: each a builder returning the
application, untrained (weights=None: nothing to download), at 32x32, compiled with a
loss and a metric."""

import keras

INPUT = {"feature_shape": (32, 32, 3), "num_classes": 10}


def _compiled(net):
    net.compile(loss=keras.losses.SparseCategoricalCrossentropy(), metrics=["accuracy"])
    return net


def mobilenet_v2():
    return _compiled(keras.applications.MobileNetV2(input_shape=(32, 32, 3), weights=None,
                                                    classes=10))


def efficientnet_b0():
    return _compiled(keras.applications.EfficientNetB0(input_shape=(32, 32, 3),
                                                       weights=None, classes=10))


def resnet50_v2():
    return _compiled(keras.applications.ResNet50V2(input_shape=(32, 32, 3), weights=None,
                                                   classes=10))


for _build in (mobilenet_v2, efficientnet_b0, resnet50_v2):
    _build.input_spec = INPUT
