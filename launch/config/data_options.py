"""The data section's nested keys: the TFRecord schema (``data.schema``) and the image
options (``data.image``).

``data.schema`` says what each ``tf.train.Example`` of a TFRecord source holds: the key
and kind of the features, their per-example shape, the label key and shape. It is a
mapping, or the name of a preset, or a mapping starting from one (``preset:`` plus the
keys that differ)::

    schema: imagenet                  # image/encoded (JPEG/PNG) and image/class/label
    schema: {preset: imagenet, num_classes: 1001}
    schema: {features: x, kind: float, shape: [784], label: y, num_classes: 10}

A preset is resolved here, so the job holds (and ``towers validate`` prints) every key.
``shape`` and ``num_classes`` may stay null: the model's input spec fills them in.

``data.image`` applies to pixel features (kinds ``image`` and ``uint8``): training
augmentation (a random crop of ``crop_area`` of the image with an aspect ratio in
``aspect_ratio``, resized to the model's size, and a random horizontal flip), the
evaluation centre crop, and the per-channel normalisation ``(pixel / 255 - mean) / std``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from launch.config.checks import (
    Invalid,
    accepted,
    boolean,
    build,
    choice,
    describe,
    number,
    optional,
    positive_int,
    string,
    tuple_of,
)
from launch.config.checks import checked_field as _field

FEATURE_KINDS = ("float", "int", "uint8", "image")
PIXEL_KINDS = ("uint8", "image")  # the kinds data.image applies to
SCHEMA_PRESETS: dict[str, dict[str, Any]] = {
    # The layout of the usual ImageNet conversion scripts, read by tf_cnn_benchmarks and
    # tensorpack, and written by `towers data convert --from images`.
    "imagenet": {"features": "image/encoded", "kind": "image", "label": "image/class/label"},
    # Decoded pixels as raw bytes: `towers data convert --from mnist / cifar10`.
    "raw_image": {"features": "image/raw", "kind": "uint8", "label": "image/class/label"},
}
ON_BAD_RECORD = ("fail", "skip")


def _unit_range(low_gt: float) -> Any:
    """[low, high] with low_gt < low <= high <= 1, as a tuple of two floats."""
    item = number(float, gt=low_gt, le=1)

    def check(value: Any) -> tuple[float, float]:
        pair = tuple_of(item)(value)
        if len(pair) != 2 or pair[0] > pair[1]:
            raise Invalid(f"expected [low, high] with low <= high, got {describe(value)}")
        return pair

    return check


def _ratio_range(value: Any) -> tuple[float, float]:
    pair = tuple_of(number(float, gt=0))(value)
    if len(pair) != 2 or pair[0] > pair[1]:
        raise Invalid(f"expected [low, high] with 0 < low <= high, got {describe(value)}")
    return pair


_shape = tuple_of(positive_int)
_per_channel = tuple_of(number(float), allow_single=True, non_empty=True)


@dataclass(frozen=True)
class RecordSchemaConfig:
    """data.schema: what each tf.train.Example of a TFRecord source holds.

    features: the key of the features; kind: how they are stored: float (a float
    list), int (an int64 list), uint8 (one bytes value of raw pixels, e.g. decoded
    images) or image (one bytes value holding a JPEG or PNG). shape: the per-example
    shape the model gets ([height, width, channels] for images, which are resized to
    it); null takes the model's. label / label_shape: the int64 label key and its
    per-example shape ([] for one class id). label_offset: subtracted from every
    stored label (1 for ImageNet files whose classes are numbered from 1).
    num_classes: labels must lie in [0, num_classes); null takes the model's.
    """

    features: str = _field("features", string)
    kind: str = _field("float", choice(*FEATURE_KINDS))
    shape: tuple[int, ...] | None = _field(None, optional(_shape))
    label: str = _field("label", string)
    label_shape: tuple[int, ...] = _field((), _shape)
    label_offset: int = _field(0, number(int, ge=0))
    num_classes: int | None = _field(None, optional(positive_int))

    @staticmethod
    def cross_check(values: dict[str, Any], raw: Any) -> None:
        shape = values["shape"]
        if values["kind"] in PIXEL_KINDS and shape is not None and (
                len(shape) != 3 or shape[2] not in (1, 3)):
            raise Invalid(f"{values['kind']} features need a shape [height, width, channels] "
                          f"with 1 or 3 channels, got {list(shape)}", "shape", ["kind"])



@dataclass(frozen=True)
class ImageConfig:
    """data.image: decoding, augmentation and normalisation of pixel features.

    augment: training only, a random crop of crop_area (fractions of the image area)
    with a width/height ratio in aspect_ratio, resized to the model's size, and with
    flip a random left-right flip. eval_crop: the central fraction of each side kept
    for evaluation (and for training without augment) before resizing. mean / std:
    per-channel values in [0, 1] pixel units (one value for every channel, or one per
    channel); null: ImageNet's (0.485, 0.456, 0.406) / (0.229, 0.224, 0.225) for RGB,
    their averages for grey-scale images.
    """

    augment: bool = _field(True, boolean)
    crop_area: tuple[float, float] = _field((0.08, 1.0), _unit_range(0))
    aspect_ratio: tuple[float, float] = _field((0.75, 4 / 3), _ratio_range)
    flip: bool = _field(True, boolean)
    eval_crop: float = _field(0.875, number(float, gt=0, le=1))
    mean: tuple[float, ...] | None = _field(None, optional(_per_channel))
    std: tuple[float, ...] | None = _field(None, optional(tuple_of(
        number(float, gt=0), allow_single=True, non_empty=True)))


def record_schema(value: Any) -> RecordSchemaConfig | None:
    """data.schema: null, a preset name, or a mapping (optionally with ``preset:``)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = {"preset": value}
    if not isinstance(value, dict):
        raise Invalid(f"expected a preset name ({', '.join(SCHEMA_PRESETS)}) or a mapping "
                      f"of features, kind, shape, label, ...; got {describe(value)}")
    raw = dict(value)
    if "preset" in raw:
        name = raw.pop("preset")
        if not isinstance(name, str) or name not in SCHEMA_PRESETS:
            shown = name if isinstance(name, str) else describe(name)
            raise Invalid(f"unknown preset {shown!r}; {accepted(str(shown), SCHEMA_PRESETS)}",
                          "preset")
        raw = {**SCHEMA_PRESETS[name], **raw}
    return build(RecordSchemaConfig, raw)


def image_section(value: Any) -> ImageConfig:
    """data.image: a mapping of image options (null: the defaults)."""
    return build(ImageConfig, value)
