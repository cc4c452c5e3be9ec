"""The images `towers bench --input` is made of: random smooth pictures and their JPEG
bytes, for the TFRecord files its rows read and for the JPEG decoding table."""

from __future__ import annotations

import numpy as np


def smooth_images(rng: np.random.Generator, count: int, height: int, width: int,
                  channels: int) -> np.ndarray:
    """uint8 [count, height, width, channels]: coarse random blobs plus a little noise,
    so JPEG sizes are those of photographs rather than of noise or flat colour."""
    coarse = rng.uniform(0, 255, (count, -(-height // 4), -(-width // 4), channels))
    blocks = coarse.repeat(4, axis=1).repeat(4, axis=2)[:, :height, :width]
    return np.clip(blocks + rng.normal(0, 12, blocks.shape), 0, 255).astype(np.uint8)


def encode_jpegs(images: np.ndarray) -> list[bytes]:
    """Each of uint8 images [count, height, width, channels] as JPEG bytes (quality 90)."""
    import tensorflow as tf

    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        image = tf.compat.v1.placeholder(tf.uint8, images.shape[1:])
        jpeg = tf.io.encode_jpeg(image, quality=90)
        return [session.run(jpeg, {image: one}) for one in images]
