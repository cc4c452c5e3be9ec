"""Images: decode, training augmentation, evaluation centre crop, normalisation.

Encoded images (JPEG, PNG; BMP and GIF too) are decoded one at a time in the input
pipeline's parallel map; a JPEG is decoded and cropped in one op
(``decode_and_crop_jpeg``), which skips the rows outside the crop. Raw pixels (the
``uint8`` kind, stored at the model's size) are cropped and resized a whole batch at a
time with ``crop_and_resize``.

Training (``data.image.augment``): a random crop whose area is a fraction
``crop_area`` of the image and whose width/height is in ``aspect_ratio``, resized to
the model's size, then a random left-right flip (``flip``). Evaluation, and training
without ``augment``: the central ``eval_crop`` of each side, resized. Then per
channel ``(pixel / 255 - mean) / std``. Randomness is stateless, seeded by
``data.seed`` and each example's position in the data (launch.data.position), so
an example's crop is the same whichever reader takes it, and on every resume.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import tensorflow as tf

import towers
from launch.config import ImageConfig
from launch.data.errors import DataError, tf_error_text
from launch.log import descriptor_2_captured

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_WHOLE_IMAGE = ((0.0, 0.0, 1.0, 1.0),)  # the "object" a random crop must overlap
_AUGMENT = 1  # the salt of a batch of raw pixels' crops and flips


@dataclass(frozen=True)
class ImageOptions:
    """data.image resolved for one pipeline: output size, and whether it augments."""

    height: int
    width: int
    channels: int
    augment: bool  # training with data.image.augment
    flip: bool
    crop_area: tuple[float, float]
    aspect_ratio: tuple[float, float]
    eval_crop: float
    mean: tuple[float, ...]
    std: tuple[float, ...]


def image_options(cfg: ImageConfig, shape: Sequence[int], training: bool) -> ImageOptions:
    """The options for images of ``shape`` [height, width, channels]."""
    height, width, channels = shape
    mean = _per_channel("mean", cfg.mean, IMAGENET_MEAN, channels)
    std = _per_channel("std", cfg.std, IMAGENET_STD, channels)
    return ImageOptions(height, width, channels, training and cfg.augment, cfg.flip,
                        cfg.crop_area, cfg.aspect_ratio, cfg.eval_crop, mean, std)


def _per_channel(name: str, given: tuple[float, ...] | None, imagenet: tuple[float, ...],
                 channels: int) -> tuple[float, ...]:
    if given is None:  # ImageNet's RGB statistics; their average for grey-scale images
        return imagenet if channels == 3 else (sum(imagenet) / 3,) * channels
    if len(given) == 1:
        return given * channels
    if len(given) != channels:
        raise DataError(f"data.image.{name} has {len(given)} values, the images have "
                        f"{channels} channel(s): give one value or one per channel")
    return given


# ------------------------------------------------------------------ one encoded image


def decode(encoded: tf.Tensor, seed: tf.Tensor, opts: ImageOptions) -> tf.Tensor:
    """encoded: a scalar string (JPEG, PNG, ...); seed: int64 [2].

    Returns float32 [height, width, channels], pixel values in [0, 255].
    """
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))

    def jpeg() -> tf.Tensor:
        window = _window(tf.image.extract_jpeg_shape(encoded), crop_seed, opts)
        return tf.image.decode_and_crop_jpeg(encoded, window, channels=opts.channels)

    def other() -> tf.Tensor:
        image = tf.io.decode_image(encoded, channels=opts.channels, expand_animations=False)
        top, left, height, width = tf.unstack(_window(tf.shape(image), crop_seed, opts))
        return tf.image.crop_to_bounding_box(image, top, left, height, width)

    crop = tf.cond(tf.io.is_jpeg(encoded), jpeg, other)
    image = tf.image.resize(crop, [opts.height, opts.width])
    if opts.augment and opts.flip:
        image = tf.image.stateless_random_flip_left_right(image, flip_seed)
    image.set_shape([opts.height, opts.width, opts.channels])
    return image


def _window(shape: tf.Tensor, seed: tf.Tensor, opts: ImageOptions) -> tf.Tensor:
    """The crop of an image of ``shape`` [height, width, channels]: int32
    [top, left, height, width]; random when augmenting, else the central eval_crop."""
    shape = tf.cast(shape, tf.int32)
    if opts.augment:
        begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
            shape, bounding_boxes=tf.constant([_WHOLE_IMAGE], tf.float32), seed=seed,
            min_object_covered=opts.crop_area[0], aspect_ratio_range=opts.aspect_ratio,
            area_range=opts.crop_area, max_attempts=100, use_image_if_no_bounding_boxes=True)
        return tf.stack([begin[0], begin[1], size[0], size[1]])
    kept = tf.maximum(tf.cast(tf.cast(shape[:2], tf.float32) * opts.eval_crop, tf.int32), 1)
    offset = (shape[:2] - kept) // 2
    return tf.concat([offset, kept], axis=0)


# ------------------------------------------------------------------- batches of pixels


def pixels(images: tf.Tensor, positions: tf.Tensor | None, seed: int,
           opts: ImageOptions) -> tf.Tensor:
    """images: uint8 [B, height, width, channels] already at the output size; positions:
    int64 [B], the examples' positions, whose draws (towers.example_uniform) are their
    crops and flips (None when not augmenting). Returns float32 [B, height, width,
    channels] in [0, 255], augmented (training) or centre-cropped (eval_crop < 1) and
    resized back to the same size."""
    batch = tf.shape(images)[0]
    size = [opts.height, opts.width]
    if opts.augment:  # crop_and_resize reads uint8 and gives float32: no cast first
        draws = towers.example_uniform(positions, 5, towers.example_seed(seed, _AUGMENT))
        images = tf.image.crop_and_resize(images, random_boxes(draws[:, :4], opts),
                                          tf.range(batch), size)
        if opts.flip:  # each image of the batch flipped or not on its own
            flipped = draws[:, 4] < 0.5
            images = tf.where(flipped[:, None, None, None], tf.reverse(images, [2]), images)
        return images
    if opts.eval_crop < 1:
        margin = (1 - opts.eval_crop) / 2
        boxes = tf.tile([[margin, margin, 1 - margin, 1 - margin]], [batch, 1])
        return tf.image.crop_and_resize(images, boxes, tf.range(batch), size)
    return tf.cast(images, tf.float32)


def random_boxes(draws: tf.Tensor, opts: ImageOptions) -> tf.Tensor:
    """draws: uniform [B, 4] -> float32 [B, 4] crop boxes (top, left, bottom, right in
    [0, 1]) of area in crop_area and width/height in aspect_ratio, each placed uniformly.

    Written here, vectorised over the batch, because tf.image's sampler draws one box
    per call; a box the image cannot hold at that ratio is clipped to the image
    rather than redrawn.
    """
    low, high = opts.crop_area
    area = low + draws[:, 0] * (high - low)
    low, high = (math.log(r) for r in opts.aspect_ratio)
    ratio = tf.exp(low + draws[:, 1] * (high - low)) * (opts.height / opts.width)
    height = tf.minimum(1.0, tf.sqrt(area / ratio))  # in fractions of each side
    width = tf.minimum(1.0, tf.sqrt(area * ratio))
    top = draws[:, 2] * (1 - height)
    left = draws[:, 3] * (1 - width)
    return tf.stack([top, left, top + height, left + width], axis=1)


def normalise(images: tf.Tensor, opts: ImageOptions) -> tf.Tensor:
    """images: float [..., channels] in [0, 255] -> (pixel / 255 - mean) / std, float32."""
    scale = tf.constant([1 / (255 * s) for s in opts.std], tf.float32)
    shift = tf.constant([m / s for m, s in zip(opts.mean, opts.std, strict=True)], tf.float32)
    return tf.cast(images, tf.float32) * scale - shift


# ------------------------------------------------------------------ up-front checks


def check_decodes(images: Sequence[tuple[str, bytes]], channels: int) -> None:
    """Decode each (where, encoded bytes) in a graph of its own; a DataError naming
    ``where`` for the first that is not a readable JPEG, PNG, GIF or BMP.

    libjpeg prints its own words for a bad JPEG straight to file descriptor 2; they
    are caught and put in the error, so the user reads one line."""
    if not images:
        return
    with tf.Graph().as_default():
        encoded = tf.compat.v1.placeholder(tf.string, [])
        decoded = tf.io.decode_image(encoded, channels=channels, expand_animations=False)
        with tf.compat.v1.Session() as session:
            for where, data in images:
                try:
                    with descriptor_2_captured() as printed:
                        session.run(decoded.op, {encoded: data})
                except tf.errors.InvalidArgumentError as err:
                    said = "".join(f" ({line.strip()})" for line in printed if line.strip())
                    raise DataError(f"{where}: the image does not decode: "
                                    f"{tf_error_text(err.message)}{said}") from None
