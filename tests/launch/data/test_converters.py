"""`towers data convert`'s formats: each written byte for byte here, converted, and read
back through the pipeline it is meant for; and each format's bad input."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.data_files import (
    class_images,
    encode,
    read_all,
    write_cifar10,
    write_corpus,
    write_image_folder,
    write_mnist,
)

import models
from launch.config import from_dict
from launch.data import DataError, check_source, make_dataset, resolve_input_spec
from launch.data.converters import ConvertOptions, convert_files, shard_names
from launch.data.converters.text import read_vocab


def _read_back(summary, spec=None, batch=None, **data_keys):
    """Every example of a conversion, read as its summary's data section says."""
    job = from_dict({"data": {**summary.data, **data_keys}})
    spec = spec or resolve_input_spec("bare", None, job.data)
    cfg = job.data
    check_source(cfg.source, spec, cfg.path, schema=cfg.schema)
    dataset = make_dataset(cfg.source, spec, batch or summary.examples, path=cfg.path,
                           schema=cfg.schema, image=cfg.image, training=False, repeat=False)
    return read_all(dataset)


def _examples(images: np.ndarray, labels: np.ndarray) -> set:
    """(pixels, label) of each example: conversion stripes examples over shards."""
    return {(image.tobytes(), int(label)) for image, label in zip(images, labels, strict=True)}


@pytest.mark.parametrize("compress", [False, True])
def test_mnist_idx_round_trip(graph, tmp_path, compress):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (30, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, 30).astype(np.uint8)
    paths = write_mnist(tmp_path, images, labels, compress)
    summary = convert_files("mnist", list(reversed(paths)), str(tmp_path / "mnist"), 3)
    assert summary.files == shard_names(tmp_path / "mnist", 3) and summary.examples == 30
    assert summary.model == {"image_size": 28, "channels": 1, "num_classes": 10}
    x, y = _read_back(summary, image={"augment": False, "eval_crop": 1.0, "mean": 0, "std": 1})
    assert x.shape == (30, 28, 28, 1)
    got = np.rint(x[..., 0] * 255).astype(np.uint8)
    assert _examples(got, y) == _examples(images, labels)


def test_mnist_bad_files(tmp_path):
    images = np.zeros((4, 28, 28), np.uint8)
    image_path, label_path = write_mnist(tmp_path, images, np.array([1, 2, 3, 11]))
    with pytest.raises(DataError, match=r"labels-idx1-ubyte: label 11 at record 3 is not a digit"):
        convert_files("mnist", [image_path, label_path], str(tmp_path / "o"), 1)
    data = bytearray(open(image_path, "rb").read())
    open(image_path, "wb").write(bytes(data[:-5]))
    with pytest.raises(DataError, match=r"idx header says \[4, 28, 28\] \(3136 bytes of data\), "
                                        r"the file has 3131"):
        convert_files("mnist", [image_path, label_path], str(tmp_path / "o"), 1)
    data[2] = 0x0D  # float32 data
    open(image_path, "wb").write(bytes(data))
    with pytest.raises(DataError, match=f"{image_path}: idx type 0x0d"):
        convert_files("mnist", [image_path, label_path], str(tmp_path / "o"), 1)
    with pytest.raises(DataError, match="two idx files"):
        convert_files("mnist", [label_path], str(tmp_path / "o"), 1)


def test_cifar10_binary_round_trip(graph, tmp_path):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (20, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, 20)
    first = write_cifar10(tmp_path / "data_batch_1.bin", images[:12], labels[:12])
    second = write_cifar10(tmp_path / "data_batch_2.bin", images[12:], labels[12:])
    summary = convert_files("cifar10", [first, second], str(tmp_path / "cifar"), 2)
    assert summary.examples == 20 and summary.data["schema"]["shape"] == [32, 32, 3]
    x, y = _read_back(summary, image={"eval_crop": 1.0, "mean": 0, "std": 1})
    got = np.rint(x * 255).astype(np.uint8)
    assert _examples(got, y) == _examples(images, labels)


def test_cifar10_bad_files(tmp_path):
    images = np.zeros((2, 32, 32, 3), np.uint8)
    path = write_cifar10(tmp_path / "b.bin", images, np.array([3, 12]))
    with pytest.raises(DataError, match=r"b.bin: record 1 has label byte 12"):
        convert_files("cifar10", [path], str(tmp_path / "o"), 1)
    (tmp_path / "short.bin").write_bytes(b"\0" * 3000)
    with pytest.raises(DataError, match=r"short.bin: 3000 bytes is not a whole number of "
                                        r"CIFAR-10 records \(3073 bytes"):
        convert_files("cifar10", [str(tmp_path / "short.bin")], str(tmp_path / "o"), 1)


def test_image_folder_round_trip(graph, tmp_path):
    images, labels = class_images(15, size=12)
    write_image_folder(tmp_path / "photos", images, labels)
    (tmp_path / "photos" / "cat" / "notes.txt").write_text("not an image")
    summary = convert_files("images", [str(tmp_path / "photos")], str(tmp_path / "out/train"), 2)
    assert summary.examples == 15 and summary.extra == [str(tmp_path / "out/train.labels")]
    assert (tmp_path / "out/train.labels").read_text() == "cat\ndog\nowl\n"
    assert summary.notes and "ignored 1 file" in summary.notes[0]
    assert summary.data["schema"] == {"preset": "imagenet", "num_classes": 3}
    x, y = _read_back(summary, spec=None, image={"eval_crop": 1.0, "mean": 0, "std": 1},
                      schema={"preset": "imagenet", "num_classes": 3, "shape": [12, 12, 3]})
    # each image's brightness tells its class: JPEG and PNG kept it
    y_by_brightness = y[np.argsort(x.mean(axis=(1, 2, 3)))]
    assert np.array_equal(np.sort(y), np.sort(labels)) and np.all(np.diff(y_by_brightness) >= 0)
    # a validation folder gets the training set's class numbers from the labels file
    write_image_folder(tmp_path / "val", images[:4], labels[:4])
    (tmp_path / "val" / "owl").mkdir(exist_ok=True)
    val = convert_files("images", [str(tmp_path / "val")], str(tmp_path / "out/val"), 1,
                        ConvertOptions(labels=str(tmp_path / "out/train.labels")))
    assert val.extra == [] and val.examples == 4


def test_image_folder_bad_image_is_named(tmp_path):
    images, labels = class_images(4, size=8)
    write_image_folder(tmp_path / "photos", images, labels)
    bad = tmp_path / "photos" / "dog" / "broken.jpg"
    bad.write_bytes(encode(images[0])[:40])
    with pytest.raises(DataError, match=f"^{bad}: the image does not decode"):
        convert_files("images", [str(tmp_path / "photos")], str(tmp_path / "o"), 1)
    assert not list(tmp_path.glob("o-*"))  # nothing left under a shard's name
    with pytest.raises(DataError, match="no class folders"):
        (tmp_path / "empty").mkdir()
        convert_files("images", [str(tmp_path / "empty")], str(tmp_path / "o"), 1)


def test_text_corpus_vocabulary_and_windows(graph, tmp_path):
    corpus = write_corpus(tmp_path / "train.txt", lines=120)
    summary = convert_files("text", [corpus], str(tmp_path / "lm"), 2,
                            ConvertOptions(min_count=2, num_steps=5))
    vocab = read_vocab(str(tmp_path / "lm.vocab"))
    words = list(vocab)
    assert words[:2] == ["<unk>", "<eos>"] and words[2] == "the"  # the most frequent word
    assert not any(word.startswith("rare") for word in words)  # seen once: below min_count
    assert summary.model == {"vocab_size": len(vocab), "num_steps": 5}
    tokens = [w for line in open(corpus) for w in [*line.split(), "<eos>"]]
    ids = np.array([vocab.get(w, 0) for w in tokens])
    x, y = _read_back(summary)
    assert x.shape == (summary.examples, 5) and summary.examples == (len(ids) - 1) // 5
    starts = x[:, 0]  # windows are consecutive: label = the next token
    assert np.array_equal(x[:, 1:], y[:, :-1])
    windows = {tuple(ids[i:i + 5]) for i in range(0, summary.examples * 5, 5)}
    assert {tuple(row) for row in x} == windows and starts.max() < len(vocab)
    data = from_dict({"data": summary.data}).data
    lstm = models.build("lstm_lm", summary.model).input_spec
    assert resolve_input_spec("lstm_lm", lstm, data) == lstm  # the model and the data agree
    assert resolve_input_spec("bare", None, data) == lstm  # or the data alone says it all
    valid = write_corpus(tmp_path / "valid.txt", lines=20, seed=5)
    again = convert_files("text", [valid], str(tmp_path / "valid"), 1,
                          ConvertOptions(vocab=str(tmp_path / "lm.vocab"), num_steps=5))
    assert again.extra == [] and again.model["vocab_size"] == len(vocab)


def test_text_bad_input(tmp_path):
    (tmp_path / "bin.txt").write_bytes(b"caf\xe9 au lait\n")
    with pytest.raises(DataError, match=r"bin.txt: not UTF-8 text"):
        convert_files("text", [str(tmp_path / "bin.txt")], str(tmp_path / "o"), 1)
    (tmp_path / "tiny.txt").write_text("one two\n")
    with pytest.raises(DataError, match="make no window of 20 steps"):
        convert_files("text", [str(tmp_path / "tiny.txt")], str(tmp_path / "o"), 1)
    (tmp_path / "v.vocab").write_text("a\nb\n")
    with pytest.raises(DataError, match="starts with <unk> and <eos>"):
        convert_files("text", [str(tmp_path / "tiny.txt")], str(tmp_path / "o"), 1,
                      ConvertOptions(vocab=str(tmp_path / "v.vocab")))


def test_more_shards_than_examples(tmp_path):
    paths = write_mnist(tmp_path, np.zeros((2, 28, 28), np.uint8), np.array([0, 1]))
    with pytest.raises(DataError, match="3 shards for only 2 examples"):
        convert_files("mnist", list(paths), str(tmp_path / "o"), 3)


# ------------------------------------------- each format converted, trained, evaluated

SMALL_CONVNET = {"name": "convnet", "filters": [4], "kernel_size": 3, "dense_units": 8}


def _mnist(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (40, 28, 28), dtype=np.uint8)
    return write_mnist(tmp_path, images, rng.integers(0, 10, 40), compress=True), SMALL_CONVNET


def _cifar10(tmp_path):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (40, 32, 32, 3), dtype=np.uint8)
    path = write_cifar10(tmp_path / "data_batch_1.bin", images, rng.integers(0, 10, 40))
    return [path], {**SMALL_CONVNET, "image_size": 32, "channels": 3}


def _text(tmp_path):
    return [write_corpus(tmp_path / "train.txt")], {"name": "lstm_lm", "hidden_size": 8,
                                                     "num_layers": 1}


def converted_job(summary, model: dict, checkpoint_dir) -> dict:
    """A job training and evaluating on what a conversion wrote, as its summary says."""
    return {"model": {**model, **summary.model}, "data": summary.data,
            "towers": {"devices": 1},
            "train": {"steps": 3, "batch_size": 8, "log_every_steps": 1,
                      "checkpoint_dir": str(checkpoint_dir)},
            "eval": {"steps": 1, "batch_size": 8}}


FORMAT_INPUTS = {"mnist": _mnist, "cifar10": _cifar10, "text": _text}


@pytest.mark.parametrize("fmt", list(FORMAT_INPUTS))
def test_each_format_trains_and_evaluates(tmp_path, fmt):
    """In this process, as `towers train` and `towers eval` run them (the image-folder
    format goes through the commands themselves, in test_data_e2e)."""
    from launch.runtime.evaluate import evaluate
    from launch.runtime.train import train

    paths, model = FORMAT_INPUTS[fmt](tmp_path)
    summary = convert_files(fmt, list(paths), str(tmp_path / "out" / "train"), 2)
    job = from_dict(converted_job(summary, model, tmp_path / "ckpt"))
    trained = train(job, write=lambda line: None)
    assert trained["global_step"] == 3 and np.isfinite(trained["loss"])
    scored = evaluate(job, write=lambda line: None)
    assert scored["global_step"] == 3 and np.isfinite(scored["loss"])
