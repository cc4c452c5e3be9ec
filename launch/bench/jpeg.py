"""`towers bench --input`'s JPEG table: what decoding costs per image, and what fusing
the crop into the decode (``decode_and_crop_jpeg``, as ``launch.data.images`` does)
saves over decoding the whole image and cropping it.

Each way runs as a tf.data map on one thread (a one-thread private pool, parallelism
1) over the same JPEGs with the same random Inception-style crops, resized to half
the side; the figure is the CPU time of this process per image (the median of a few
passes), which other processes on a shared host do not stretch as they do wall time.
"""

from __future__ import annotations

import resource
import statistics

import numpy as np

from launch.bench.images import encode_jpegs, smooth_images

IMAGES = 64
PASSES = 5
BATCHES_PER_PASS = 10


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def decode_costs(sides: tuple[int, ...], channels: int = 3) -> list[dict]:
    """For JPEGs of each side: CPU ms per image decoded-then-cropped and fused."""
    rng = np.random.default_rng(0)
    rows = []
    for side in sides:
        jpegs = encode_jpegs(smooth_images(rng, IMAGES, side, side, channels))
        row = {"side": side, "bytes": int(np.mean([len(j) for j in jpegs]))}
        for fused in (False, True):
            row["fused" if fused else "decode, then crop"] = _cost(jpegs, side // 2, fused,
                                                                  channels)
        rows.append(row)
    return rows


def _cost(jpegs: list[bytes], out: int, fused: bool, channels: int) -> float:
    """CPU ms per image of one way of decoding, cropping and resizing ``jpegs``."""
    import tensorflow as tf

    def crop(encoded: tf.Tensor, number: tf.Tensor) -> tf.Tensor:
        begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
            tf.image.extract_jpeg_shape(encoded), tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
            seed=tf.stack([tf.constant(0, tf.int64), number]), min_object_covered=0.08,
            area_range=(0.08, 1.0), aspect_ratio_range=(0.75, 4 / 3))
        if fused:
            window = tf.stack([begin[0], begin[1], size[0], size[1]])
            image = tf.image.decode_and_crop_jpeg(encoded, window, channels=channels)
        else:
            image = tf.slice(tf.io.decode_jpeg(encoded, channels=channels), begin, size)
        return tf.image.resize(image, [out, out])

    options = tf.data.Options()
    options.threading.private_threadpool_size = 1
    with tf.Graph().as_default():
        dataset = tf.data.Dataset.from_tensor_slices(jpegs).repeat().enumerate()
        dataset = dataset.map(lambda n, e: crop(e, n), num_parallel_calls=1)
        batch = tf.compat.v1.data.make_one_shot_iterator(
            dataset.batch(IMAGES).with_options(options)).get_next()
        with tf.compat.v1.Session() as session:
            session.run(batch)
            costs = []
            for _ in range(PASSES):
                start = _cpu_seconds()
                for _ in range(BATCHES_PER_PASS):
                    session.run(batch)
                costs.append(1000 * (_cpu_seconds() - start) / (BATCHES_PER_PASS * IMAGES))
    return statistics.median(costs)


def decode_report(rows: list[dict]) -> str:
    lines = ["| JPEG side | bytes | decode, then crop: CPU ms per image | fused: CPU ms per image "
             "| fused / decode, then crop |", "| --- | --- | --- | --- | --- |"]
    for row in rows:
        plain, fused = row["decode, then crop"], row["fused"]
        lines.append(f"| {row['side']} | {row['bytes']} | {plain:.3f} | {fused:.3f} | "
                     f"{fused / plain:.3f} |")
    return "\n".join(lines)
