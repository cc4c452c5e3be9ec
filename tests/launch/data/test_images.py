"""Images: fused decode-and-crop, augmentation, centre crop, normalisation, checks."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from helpers.data_files import encode

from launch.config import ImageConfig
from launch.data import DataError
from launch.data.images import (
    IMAGENET_MEAN,
    check_decodes,
    decode,
    image_options,
    normalise,
    pixels,
    random_boxes,
)


def _run(tensors, feed=None):
    with tf.compat.v1.Session() as session:
        return session.run(tensors, feed)


def _gradient(height=24, width=32) -> np.ndarray:
    """uint8 [height, width, 3]: red rises left to right, green top to bottom."""
    y, x = np.mgrid[0:height, 0:width]
    return np.stack([x * 255 // (width - 1), y * 255 // (height - 1),
                     np.full_like(x, 128)], axis=-1).astype(np.uint8)


def _options(shape=(8, 8, 3), training=False, **keys):
    return image_options(ImageConfig(**keys), shape, training)


def _decode(data: bytes, seed: int, opts) -> np.ndarray:
    return _run(decode(tf.constant(data), tf.constant([0, seed], tf.int64), opts))


def test_png_centre_crop_is_exact(graph):
    image = _gradient(16, 16)
    out = _decode(encode(image, "png"), 0, _options((8, 8, 3), eval_crop=0.5))
    assert out.shape == (8, 8, 3) and out.dtype == np.float32
    assert np.array_equal(out, image[4:12, 4:12].astype(np.float32))  # crop 8x8, no resize


def test_jpeg_crop_is_fused_and_equals_decode_then_crop(graph):
    data = encode(_gradient(40, 48), "jpeg")
    opts = _options((10, 12, 3), eval_crop=0.5)
    whole = _run(tf.io.decode_jpeg(data, channels=3))
    expected = whole[10:30, 12:36].astype(np.float32)  # the central half of each side
    resized = _run(tf.image.resize(expected, [10, 12]))
    # libjpeg upsamples chroma at the crop's edge from fewer neighbours: a pixel or two
    assert np.abs(_decode(data, 0, opts) - resized).max() <= 3
    graph_def = tf.compat.v1.get_default_graph().as_graph_def()
    ops = {node.op for function in graph_def.library.function for node in function.node_def}
    assert "DecodeAndCropJpeg" in ops and "DecodeJpeg" not in ops


def test_grey_scale_and_channel_conversion(graph):
    grey = _gradient(8, 8)[:, :, :1]
    out = _decode(encode(grey, "png"), 0, _options((8, 8, 3), eval_crop=1.0))
    assert out.shape == (8, 8, 3)
    assert np.array_equal(out[..., 0], out[..., 2])  # grey decoded into three equal channels


def test_training_crops_are_random_seeded_and_flip(graph):
    data = encode(_gradient(32, 32), "png")
    opts = _options((16, 16, 3), training=True, crop_area=(0.1, 0.3), flip=True)
    outs = [_decode(data, seed, opts) for seed in range(12)]
    assert all(o.shape == (16, 16, 3) for o in outs)
    assert np.array_equal(outs[0], _decode(data, 0, opts))  # the same seed, the same crop
    assert len({o.tobytes() for o in outs}) == 12
    red_rises = [np.all(np.diff(o[8, :, 0]) >= 0) for o in outs]
    assert any(red_rises) and not all(red_rises)  # some flipped, some not
    whole = _run(tf.image.resize(_gradient(32, 32).astype(np.float32), [16, 16]))
    # a crop of at most 30% of the area spans at most ~55% of a side: never the full range
    assert all(np.ptp(o[..., 0]) < 0.8 * np.ptp(whole[..., 0]) for o in outs)


def test_without_augment_training_takes_the_centre_crop(graph):
    data = encode(_gradient(16, 16), "png")
    augmented = _options((8, 8, 3), training=True, augment=False, eval_crop=0.5)
    evaluation = _options((8, 8, 3), training=False, eval_crop=0.5)
    assert np.array_equal(_decode(data, 1, augmented), _decode(data, 2, evaluation))


def test_random_boxes_have_the_asked_area_and_ratio(graph):
    opts = _options((32, 32, 3), training=True, crop_area=(0.2, 0.5),
                    aspect_ratio=(0.75, 4 / 3))
    draws = tf.random.stateless_uniform([2000, 4], tf.constant([3, 4], tf.int64))
    boxes = _run(random_boxes(draws, opts))
    height, width = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    assert boxes.min() >= 0 and boxes.max() <= 1 + 1e-6
    assert np.all((height * width >= 0.2 - 1e-5) & (height * width <= 0.5 + 1e-5))
    assert np.all((width / height >= 0.75 - 1e-4) & (width / height <= 4 / 3 + 1e-4))
    assert boxes[:, 0].std() > 0.05 and boxes[:, 1].std() > 0.05  # placed all over


def test_raw_pixels_batch(graph):
    batch = np.stack([_gradient(8, 8)] * 6)
    positions = tf.range(40, 46, dtype=tf.int64)
    same = _run(pixels(tf.constant(batch), None, 7, _options((8, 8, 3), eval_crop=1.0)))
    assert np.array_equal(same, batch.astype(np.float32))
    centre = _run(pixels(tf.constant(batch), None, 7, _options((8, 8, 3), eval_crop=0.5)))
    red = centre[0, 4, :, 0]  # the central half, stretched over all 8 columns
    assert centre.shape == batch.shape and np.all(np.diff(red) > 0)
    assert 50 < red[0] < 80 and 175 < red[-1] < 205
    opts = _options((8, 8, 3), training=True, crop_area=(1.0, 1.0), aspect_ratio=(1.0, 1.0))
    out = _run(pixels(tf.constant(batch), positions, 7, opts))
    expected = batch.astype(np.float32)
    flipped = [np.array_equal(o, b[:, ::-1]) for o, b in zip(out, expected, strict=True)]
    kept = [np.allclose(o, b) for o, b in zip(out, expected, strict=True)]
    assert all(f or k for f, k in zip(flipped, kept, strict=True))
    assert any(flipped) and any(kept)
    # an example's crop and flip are its position's: the same in any batch that holds it
    alone = _run(pixels(tf.constant(batch[2:4]), positions[2:4], 7, opts))
    assert np.array_equal(alone, out[2:4])


def test_normalise_per_channel(graph):
    opts = _options((1, 1, 3), mean=(0.5,), std=(0.25, 0.5, 1.0))
    out = _run(normalise(tf.constant([[[[255.0, 0.0, 127.5]]]]), opts))
    assert np.allclose(out[0, 0, 0], [2.0, -1.0, 0.0])
    grey = _options((2, 2, 1))
    assert grey.mean == (sum(IMAGENET_MEAN) / 3,)
    assert _options((2, 2, 3)).mean == IMAGENET_MEAN


def test_per_channel_values_must_match_the_channels():
    with pytest.raises(DataError, match=r"data.image.mean has 3 values, the images have 1"):
        _options((8, 8, 1), mean=(0.1, 0.2, 0.3))


def test_check_decodes_names_the_bad_image():
    good = encode(_gradient(8, 8), "jpeg")
    check_decodes([("a: record 0", good), ("a: record 1", encode(_gradient(8, 8), "png"))], 3)
    with pytest.raises(DataError, match=r"^f.tfrecord: record 1: the image does not decode"):
        check_decodes([("f.tfrecord: record 0", good),
                       ("f.tfrecord: record 1", good[:len(good) // 2])], 3)
    with pytest.raises(DataError, match="record 0: the image does not decode"):
        check_decodes([("g: record 0", b"not an image at all")], 3)


def test_libjpeg_words_go_in_the_error_not_on_stderr(capfd):
    """libjpeg prints to file descriptor 2 itself; the one line must hold its words."""
    with pytest.raises(DataError) as info:
        check_decodes([("h: record 0", b"\xff\xd8\xff\xe0 not the rest of a JPEG")], 3)
    assert str(info.value).endswith("(Input file read error)")
    assert "Input file read error" not in capfd.readouterr().err
