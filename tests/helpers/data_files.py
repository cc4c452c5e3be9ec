"""Small data sets written byte for byte in each format a user has: JPEG/PNG images
encoded by TensorFlow, ImageNet-layout TFRecords, MNIST idx files, CIFAR-10 binary
batches, a text corpus. No downloads: every file is made here."""

from __future__ import annotations

import gzip
import struct

import numpy as np
import tensorflow as tf


def encode(image: np.ndarray, fmt: str = "jpeg") -> bytes:
    """uint8 [height, width, channels] -> JPEG (quality 95) or PNG bytes, by TensorFlow."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        if fmt == "jpeg":
            return session.run(tf.io.encode_jpeg(image, quality=95))
        return session.run(tf.io.encode_png(image))


def class_images(count: int, size: int = 16, channels: int = 3, classes: int = 3,
                 seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """uint8 images [count, size, size, channels] whose class (labels [count]) sets
    their brightness, smooth enough that JPEG keeps it: a learnable toy set."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, count)
    base = (40 + 180 * labels / max(classes - 1, 1))[:, None, None, None]
    noise = rng.normal(0, 8, (count, size, size, channels))
    return np.clip(base + noise, 0, 255).astype(np.uint8), labels


def image_feature_map(encoded: bytes, label: int, **extra) -> dict:
    features = {
        "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[encoded])),
        "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
    }
    features.update(extra)
    return features


def write_examples(path, feature_maps) -> str:
    with tf.io.TFRecordWriter(str(path)) as writer:
        for feature_map in feature_maps:
            writer.write(tf.train.Example(
                features=tf.train.Features(feature=feature_map)).SerializeToString())
    return str(path)


def write_imagenet_records(path, images, labels, fmt="jpeg", label_offset=0) -> str:
    """The ImageNet conversion scripts' layout: image/encoded and image/class/label."""
    return write_examples(path, (image_feature_map(encode(image, fmt), int(label) + label_offset)
                                 for image, label in zip(images, labels, strict=True)))


def write_mnist(directory, images: np.ndarray, labels: np.ndarray,
                compress: bool = False) -> tuple[str, str]:
    """idx3 images [N, 28, 28] and idx1 labels [N], as on Y. LeCun's MNIST page."""
    image_bytes = struct.pack(">BBBBiii", 0, 0, 0x08, 3, *images.shape) + images.tobytes()
    label_bytes = struct.pack(">BBBBi", 0, 0, 0x08, 1, len(labels)) + labels.astype(
        np.uint8).tobytes()
    suffix = ".gz" if compress else ""
    image_path = directory / f"train-images-idx3-ubyte{suffix}"
    label_path = directory / f"train-labels-idx1-ubyte{suffix}"
    pack = gzip.compress if compress else (lambda data: data)
    image_path.write_bytes(pack(image_bytes))
    label_path.write_bytes(pack(label_bytes))
    return str(image_path), str(label_path)


def write_cifar10(path, images: np.ndarray, labels: np.ndarray) -> str:
    """Records of a label byte and 3072 pixel bytes (all red, then green, then blue)."""
    planes = images.transpose(0, 3, 1, 2).reshape(len(images), -1)
    records = np.concatenate([labels.astype(np.uint8)[:, None], planes], axis=1)
    path.write_bytes(records.astype(np.uint8).tobytes())
    return str(path)


def write_image_folder(root, images: np.ndarray, labels: np.ndarray,
                       names=("cat", "dog", "owl")) -> None:
    """ROOT/CLASS/i.jpg (every third a .png), one folder per class."""
    for index, (image, label) in enumerate(zip(images, labels, strict=True)):
        folder = root / names[label]
        folder.mkdir(parents=True, exist_ok=True)
        fmt = "png" if index % 3 == 0 else "jpeg"
        (folder / f"{index:04d}.{'png' if fmt == 'png' else 'jpg'}").write_bytes(
            encode(image, fmt))


def write_corpus(path, lines: int = 200, seed: int = 0) -> str:
    """A text whose next word is predictable: repeating phrases of a small vocabulary,
    with a few rare words."""
    rng = np.random.default_rng(seed)
    phrases = ["the cat sat on the mat", "a dog ran in the park", "we eat bread and jam"]
    text = []
    for i in range(lines):
        words = phrases[rng.integers(0, 3)].split()
        if i % 50 == 0:
            words.append(f"rare{i}")
        text.append(" ".join(words))
    path.write_text("\n".join(text) + "\n")
    return str(path)


def read_all(dataset) -> tuple[np.ndarray, np.ndarray]:
    """Every (features, labels) batch of a finite dataset, joined: what it gives, in order."""
    from launch.data import input_tensors

    features, labels = input_tensors(dataset)
    out = []
    with tf.compat.v1.Session() as session:
        while True:
            try:
                out.append(session.run([features, labels]))
            except tf.errors.OutOfRangeError:
                break
    return np.concatenate([x for x, _ in out]), np.concatenate([y for _, y in out])


def write_four_class_npz(path, rows: int = 96, width: int = 16) -> np.ndarray:
    """An npz of `rows` normal float32 feature rows whose class (0-3) is the signs of the
    first two features: learnable by a small MLP. Returns the features."""
    rng = np.random.default_rng(0)
    features = rng.normal(size=(rows, width)).astype(np.float32)
    labels = (features[:, 0] > 0).astype(np.int64) + 2 * (features[:, 1] > 0)
    np.savez(path, features=features, labels=labels)
    return features
