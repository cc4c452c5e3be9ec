"""TFRecord sources by schema: images and raw pixels, bad records up front and mid-run,
file sharding, and what the data reports without a model."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tensorflow as tf
from helpers.data_files import (
    class_images,
    encode,
    image_feature_map,
    write_examples,
    write_imagenet_records,
)
from helpers.sessions import quick_session

from launch.config import load_job
from launch.data import (
    DataError,
    SkippedRecords,
    check_source,
    data_spec,
    input_errors,
    input_tensors,
    make_dataset,
    ordinal,
    resolve_input_spec,
)
from launch.data.sources import tfrecord as tfrecord_source
from models import InputSpec

SPEC = InputSpec((8, 8, 3), tf.float32, (), tf.int32, 3)
GREY = InputSpec((8, 8, 1), tf.float32, (), tf.int32, 3)


def _data(*overrides: str):
    """The data section of a job with these overrides."""
    return load_job(None, [f"data.{o}" for o in overrides]).data


def _dataset(cfg, spec=SPEC, batch=4, skipped=None, **kwargs):
    return make_dataset(cfg.source, spec, batch, path=cfg.path, schema=cfg.schema,
                        image=cfg.image, skipped=skipped, **kwargs)


def _batches(dataset, count=None):
    features, labels = input_tensors(dataset)
    out = []
    with quick_session() as session:
        while count is None or len(out) < count:
            try:
                out.append(session.run([features, labels]))
            except tf.errors.OutOfRangeError:
                break
    return out


def _maps(images, labels) -> list[dict]:
    """The ImageNet-layout features of JPEG-encoded images, to spoil some of."""
    return [image_feature_map(encode(image), int(label))
            for image, label in zip(images, labels, strict=True)]


def _raw_records(path, images, labels, key="image/raw"):
    return write_examples(path, ({
        key: tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
        "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
    } for image, label in zip(images, labels, strict=True)))


# ------------------------------------------------------------------------ reading


@pytest.mark.parametrize("fmt", ["jpeg", "png"])
def test_imagenet_layout_with_the_short_schema(graph, tmp_path, fmt):
    images, labels = class_images(12, size=20)
    path = write_imagenet_records(tmp_path / "train.tfrecord", images, labels, fmt)
    cfg = _data("source=tfrecord", f"path={path}", "schema=imagenet", "image.eval_crop=1.0")
    check_source("tfrecord", SPEC, path, schema=cfg.schema)
    (x, y), = _batches(_dataset(cfg, batch=12, training=False, repeat=False))
    assert x.shape == (12, 8, 8, 3) and x.dtype == np.float32 and y.dtype == np.int32
    assert np.array_equal(y, labels)
    # normalised with ImageNet's statistics: class brightness survives decode and resize
    means = x.mean(axis=(1, 2, 3))
    assert np.all(np.diff(means[np.argsort(labels)]) >= -0.3)
    assert abs(means[labels == 0].mean() - means[labels == 2].mean()) > 2


def test_imagenet_label_offset(graph, tmp_path):
    images, labels = class_images(6, size=8)
    path = write_imagenet_records(tmp_path / "in.tfrecord", images, labels, label_offset=1)
    cfg = _data("source=tfrecord", f"path={path}", "schema={preset: imagenet, label_offset: 1}")
    (_, y), = _batches(_dataset(cfg, batch=6, training=False, repeat=False))
    assert np.array_equal(y, labels)
    with pytest.raises(DataError, match=r"holds \[3\], outside \[0, 3\)"):
        check_source("tfrecord", SPEC, path, schema=_schema("imagenet"))


def test_raw_pixels_read_back_exactly(graph, tmp_path):
    images, labels = class_images(10, size=8, channels=1)
    path = _raw_records(tmp_path / "raw.tfrecord", images, labels)
    cfg = _data("source=tfrecord", f"path={path}", "schema={preset: raw_image, shape: [8, 8, 1]}",
                "image.eval_crop=1.0", "image.mean=0", "image.std=1")
    (x, y), = _batches(_dataset(cfg, spec=GREY, batch=10, training=False, repeat=False))
    assert np.allclose(x * 255, images, atol=1e-3) and np.array_equal(y, labels)
    train = _batches(_dataset(cfg, spec=GREY, batch=5, seed=3), 4)
    assert all(b[0].shape == (5, 8, 8, 1) for b in train)


def test_numeric_schema_with_other_keys(graph, tmp_path):
    rng = np.random.default_rng(0)
    values = rng.normal(size=(9, 6)).astype(np.float32)
    path = write_examples(tmp_path / "n.tfrecord", ({
        "x": tf.train.Feature(float_list=tf.train.FloatList(value=row)),
        "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 2])),
    } for i, row in enumerate(values)))
    cfg = _data("source=tfrecord", f"path={path}",
                "schema={features: x, shape: [2, 3], label: y, num_classes: 2}")
    spec = resolve_input_spec("bare", None, cfg)  # everything from the data section
    assert spec == InputSpec((2, 3), tf.float32, (), tf.int32, 2)
    (x, y), = _batches(_dataset(cfg, spec=spec, batch=9, training=False, repeat=False))
    assert np.array_equal(x.reshape(9, 6), values) and np.array_equal(y, np.arange(9) % 2)


# --------------------------------------------------------- what the data reports


def test_data_spec_from_the_data_section_alone(tmp_path):
    cfg = _data("source=tfrecord", "path=x", "schema={preset: imagenet, shape: [32, 32, 3], "
                "num_classes: 5}")
    assert data_spec(cfg).input_spec() == InputSpec((32, 32, 3), tf.float32, (), tf.int32, 5)
    assert data_spec(_data("source=tfrecord", "path=x", "schema=imagenet")).input_spec() is None
    assert data_spec(_data("source=builtin")).input_spec() is None
    np.savez(tmp_path / "d.npz", features=np.zeros((4, 5), np.int64), labels=np.arange(4))
    npz = data_spec(_data("source=npz", f"path={tmp_path / 'd.npz'}"))
    assert npz.input_spec() == InputSpec((5,), tf.int32, (), tf.int32, 4)
    np.savez(tmp_path / "f.npz", features=np.zeros((4, 5)), labels=np.linspace(0, 1, 4))
    floats = data_spec(_data("source=npz", f"path={tmp_path / 'f.npz'}"))
    assert floats.input_spec() is None and floats.missing() == ["num_classes"]


def test_model_and_data_disagreeing_is_one_line_naming_both():
    cfg = _data("source=tfrecord", "path=x", "schema={preset: imagenet, shape: [32, 32, 3], "
                "num_classes: 5}")
    with pytest.raises(DataError) as info:
        resolve_input_spec("resnet20", InputSpec((28, 28, 1), tf.float32, (), tf.int32, 10), cfg)
    message = str(info.value)
    assert message.startswith("model 'resnet20' and the data (data.schema) disagree")
    assert "features [28, 28, 1] vs [32, 32, 3]" in message and "10 vs 5 classes" in message
    flat = InputSpec((3072,), tf.float32, (), tf.int32, 5)
    with pytest.raises(DataError, match=r"features \[3072\] vs \[32, 32, 3\]"):
        resolve_input_spec("mlp", flat, cfg)  # images are resized, never reshaped
    with pytest.raises(DataError, match="declares no input_spec and data.schema does not give"):
        resolve_input_spec("bare", None, _data("source=tfrecord", "path=x", "schema=imagenet"))
    ints = _data("source=tfrecord", "path=x", "schema={kind: int, shape: [20]}")
    with pytest.raises(DataError, match="features float32 vs int32"):
        resolve_input_spec("mlp", InputSpec((20,), tf.float32, (), tf.int32, 5), ints)


# ------------------------------------------------------------ bad records up front


def _schema(text: str):
    return _data("source=tfrecord", "path=x", f"schema={text}").schema


def _check_error(path, cfg_schema, spec=SPEC) -> str:
    with pytest.raises(DataError) as info:
        check_source("tfrecord", spec, path, schema=_schema(cfg_schema))
    assert "\n" not in str(info.value)
    return str(info.value)


def test_corrupt_image_is_named_up_front(tmp_path):
    images, labels = class_images(4, size=16)
    good = encode(images[0])
    maps = _maps(images, labels)
    maps[2] = image_feature_map(good[:len(good) // 2], 0)
    path = write_examples(tmp_path / "bad.tfrecord", maps)
    message = _check_error(path, "imagenet")
    assert message.startswith(f"{path}: record 2: the image does not decode")


def test_missing_key_wrong_kind_and_size_are_named(tmp_path):
    images, labels = class_images(3, size=8)
    maps = _maps(images, labels)
    del maps[1]["image/class/label"]
    path = write_examples(tmp_path / "missing.tfrecord", maps)
    message = _check_error(path, "imagenet")
    assert f"{path}: record 1 has no 'image/class/label' feature" in message
    raw = _raw_records(tmp_path / "raw.tfrecord", images[:, :4], labels)
    message = _check_error(raw, "{preset: raw_image, shape: [8, 8, 3]}")
    assert f"{raw}: record 0: 'image/raw' holds 96 bytes, the schema's shape [8, 8, 3] needs 192" \
        in message
    message = _check_error(raw, "imagenet")
    assert "record 0 has no 'image/encoded' feature (has ['image/class/label', 'image/raw'])" \
        in message


def test_label_out_of_range_is_named(tmp_path):
    images, _ = class_images(3, size=8)
    path = write_imagenet_records(tmp_path / "l.tfrecord", images, np.array([0, 1, 7]))
    assert f"{path}: record 2: 'image/class/label' holds [7], outside [0, 3)" in _check_error(
        path, "imagenet")


def _float_records(path, bad: int | None = None) -> tuple[str, np.ndarray]:
    """8 records of 6 floats under 'x' and a label under 'y'; record `bad` holds a NaN."""
    values = np.random.default_rng(0).normal(size=(8, 6)).astype(np.float32)
    if bad is not None:
        values[bad, 4] = np.nan
    return write_examples(path, ({
        "x": tf.train.Feature(float_list=tf.train.FloatList(value=row)),
        "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 2])),
    } for i, row in enumerate(values))), values


FLOATS = "{features: x, shape: [6], label: y, num_classes: 2}"


def test_a_feature_that_is_not_finite_is_a_bad_record_named_up_front(graph, tmp_path):
    path, values = _float_records(tmp_path / "nan.tfrecord", bad=5)
    spec = InputSpec((6,), tf.float32, (), tf.int32, 2)
    assert _check_error(path, FLOATS, spec) == (
        f"{path}: record 5: 'x' holds nan, not a finite number (the first step to meet it "
        "would diverge)")
    cfg = _data("source=tfrecord", f"path={path}", f"schema={FLOATS}", "on_bad_record=skip")
    lines = []
    skipped = SkippedRecords(path, lines.append)
    (x, _), = _batches(_dataset(cfg, spec=spec, batch=7, skipped=skipped, training=False,
                                repeat=False))
    assert skipped.count == 1 and lines[0].startswith(f"data: skipped {path}: record 5: 'x' holds "
                                                      "nan, not a finite number")
    assert np.array_equal(x, np.delete(values, 5, axis=0))  # left out, the rest in order


def test_a_file_checked_clean_is_not_read_again_at_the_next_start_until_it_changes(
        tmp_path, monkeypatch):
    """Every record is checked up front (9.4-9.8 s a GiB); a restart on the same files
    reads none of them again (launch.data.checked_records), and a file rewritten is
    checked whole again: here its last record now holds a NaN."""
    spec = InputSpec((6,), tf.float32, (), tf.int32, 2)
    path, _ = _float_records(tmp_path / "clean.tfrecord")
    check_source("tfrecord", spec, path, schema=_schema(FLOATS))
    read, records_of = [], tfrecord_source.records_of
    monkeypatch.setattr(tfrecord_source, "records_of",
                        lambda name: read.append(name) or records_of(name))
    check_source("tfrecord", spec, path, schema=_schema(FLOATS))
    assert read == []
    _float_records(tmp_path / "clean.tfrecord", bad=7)
    assert _check_error(path, FLOATS, spec).startswith(f"{path}: record 7: 'x' holds nan")
    assert read == [path]


def test_a_bad_record_anywhere_is_named_up_front(tmp_path):
    path, _ = _late_bad_records(tmp_path)  # record 20 parses; 27 has no label
    assert _check_error(path, "imagenet").startswith(
        f"{path}: record 27 has no 'image/class/label' feature")


def test_files_without_records_have_no_examples(tmp_path):
    for index in range(2):
        write_examples(tmp_path / f"e{index}.tfrecord", [])
    glob = str(tmp_path / "e*.tfrecord")
    assert _check_error(glob, "imagenet") == f"{glob}: no examples: no records in any file"


def test_skipping_leaves_schema_checks_to_the_pipeline_but_not_an_empty_source(tmp_path):
    path, _ = _late_bad_records(tmp_path)
    check_source("tfrecord", SPEC, path, schema=_schema("imagenet"), on_bad_record="skip")
    images, _ = class_images(2, size=8)
    none_good = write_imagenet_records(tmp_path / "nine.tfrecord", images, np.array([9, 9]))
    with pytest.raises(DataError, match=r"nine.tfrecord: no examples: all 2 records are bad, "
                                        r"e\.g\. .*nine.tfrecord: record 0: 'image/class/label' "
                                        r"holds \[9\]"):
        check_source("tfrecord", SPEC, none_good, schema=_schema("imagenet"),
                     on_bad_record="skip")


# -------------------------------------------------------------- bad records mid-run


def _late_bad_records(tmp_path):
    """40 records; 20 (a truncated JPEG), 27 (no label) and 33 (label 9) are bad,
    past the records whose images are decoded up front."""
    images, labels = class_images(40, size=12)
    maps = _maps(images, labels)
    maps[20] = image_feature_map(encode(images[20])[:50], int(labels[20]))
    del maps[27]["image/class/label"]
    maps[33] = image_feature_map(encode(images[33]), 9)
    return write_examples(tmp_path / "late.tfrecord", maps), labels


def _undecodable(tmp_path, bad: list[int], count: int = 40, name: str = "late.tfrecord"):
    """``count`` records; those at ``bad`` hold truncated JPEGs, which only decoding finds."""
    images, labels = class_images(count, size=12)
    maps = _maps(images, labels)
    for index in bad:
        maps[index] = image_feature_map(encode(images[index])[:50], int(labels[index]))
    return write_examples(tmp_path / name, maps), labels


def test_skip_names_and_counts_every_bad_record(graph, tmp_path):
    path, labels = _late_bad_records(tmp_path)
    cfg = _data("source=tfrecord", f"path={path}", "schema=imagenet", "on_bad_record=skip")
    lines, counted = [], []
    skipped = SkippedRecords(path, lines.append, counted.append)
    batches = _batches(_dataset(cfg, batch=37, skipped=skipped, training=False, repeat=False))
    assert skipped.count == 3 and sum(counted) == 3  # the metric's counter got them all
    got = np.concatenate([y for _, y in batches])
    assert np.array_equal(got, np.delete(labels, [20, 27, 33]))
    assert lines == [
        f"data: skipped {path}: record 20: 'image/encoded' does not decode as an image "
        "(the 1st record skipped; data.on_bad_record: skip)",
        f"data: skipped {path}: record 27 has no 'image/class/label' feature (has "
        "['image/encoded']); set data.schema to the file's layout (the 2nd record skipped; "
        "data.on_bad_record: skip)",
        f"data: skipped {path}: record 33: 'image/class/label' holds [9], outside [0, 3) "
        "(the 3rd record skipped; data.on_bad_record: skip)"]


def test_skip_names_the_first_ten_then_counts(graph, tmp_path):
    bad = list(range(10, 60, 2))  # 25 records
    path, labels = _undecodable(tmp_path, bad, count=60)
    cfg = _data("source=tfrecord", f"path={path}", "schema=imagenet", "on_bad_record=skip")
    lines = []
    skipped = SkippedRecords(path, lines.append)
    got = np.concatenate([y for _, y in _batches(_dataset(
        cfg, batch=7, skipped=skipped, training=False, repeat=False))])
    assert skipped.count == 25 and np.array_equal(got, np.delete(labels, bad))
    named = [f"data: skipped {path}: record {index}: 'image/encoded' does not decode as an "
             f"image (the {ordinal(n)} record skipped; data.on_bad_record: skip)"
             for n, index in enumerate(bad[:10], start=1)]
    assert lines[:10] == named
    # then a line once naming stops, and at 16: each batch reports its skips at once
    counts = [int(re.fullmatch(rf"data: skipped (\d+) records of {re.escape(path)} so far, the "
                               r"first 10 named above \(data.on_bad_record: skip\)", line)[1])
              for line in lines[10:]]
    assert len(counts) == 2 and 10 < counts[0] < 16 <= counts[1] < 32


def test_ordinals():
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 23, 101, 111, 112)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "23rd", "101st",
        "111th", "112th"]


def test_skip_counts_again_each_epoch_while_training(graph, tmp_path):
    path, _ = _late_bad_records(tmp_path)
    cfg = _data("source=tfrecord", f"path={path}", "schema=imagenet", "on_bad_record=skip")
    skipped = SkippedRecords(path, lambda line: None)
    _batches(_dataset(cfg, batch=8, skipped=skipped, seed=1, shuffle_buffer=64,
                      num_parallel_calls=1, prefetch=1), 12)
    # 96 good records given: two whole epochs of 37 good and 3 bad, so at least 6 skips.
    # Read ahead by however much the threads got to: at most two batches and the
    # shuffle buffer of 64, i.e. within the first 96 + 16 + 64 records, 4.4 epochs.
    assert 6 <= skipped.count <= 15


def test_training_reports_its_skips_in_the_result_and_the_metrics(tmp_path):
    """`towers train`'s loop, in this process, with its metrics served on loopback."""
    from launch import metrics
    from launch.config import MetricsConfig
    from launch.runtime.train import train

    path, _ = _undecodable(tmp_path, [20, 27, 33])
    job = load_job(None, [
        "model.name=convnet", "model.image_size=12", "model.channels=3",
        "model.num_classes=3", "model.filters=[4]", "model.dense_units=8",
        "data.source=tfrecord", f"data.path={path}", "data.schema=imagenet",
        "data.on_bad_record=skip", "data.shuffle_buffer=0", "data.num_parallel_calls=1",
        "data.prefetch=1", "towers.devices=1", "train.batch_size=8", "train.steps=3",
        f"train.checkpoint_dir={tmp_path / 'ckpt'}"])
    lines = []
    with metrics.serve(MetricsConfig(port=0), metrics.Identity("train", 0, "r"),
                       lines.append) as exporter:
        result = train(job, exporter=exporter, write=lines.append)
        counted = exporter.metrics.get_sample_value("towers_input_skipped_records_total")
    # 24 examples in order take records 0-24, so record 20 is skipped; records 27 and
    # 33 only if the pipeline read that far ahead (at most two batches)
    assert 1 <= result["skipped_records"] <= 3 and counted == result["skipped_records"]
    assert f"data: skipped {path}: record 20: 'image/encoded' does not decode as an image " \
           "(the 1st record skipped; data.on_bad_record: skip)" in lines, lines


def test_fail_mode_stops_with_one_line_naming_the_record(graph, tmp_path):
    path, _ = _undecodable(tmp_path, [20])
    cfg = _data("source=tfrecord", f"path={path}", "schema=imagenet")
    check_source("tfrecord", SPEC, path, schema=cfg.schema)  # images decoded: 0 to 7
    features, _ = input_tensors(_dataset(cfg, batch=8, training=False, repeat=False))
    with pytest.raises(DataError) as info, input_errors(path), quick_session() as session:
        for _ in range(5):
            session.run(features)
    assert str(info.value) == (f"{path}: record 20: 'image/encoded' does not decode as an image "
                               "(data.on_bad_record: skip leaves such records out)")


def test_fail_mode_finds_a_bad_last_record_of_a_finite_stream(graph, tmp_path):
    path, _ = _undecodable(tmp_path, [38, 39])  # nothing good comes after them
    cfg = _data("source=tfrecord", f"path={path}", "schema=imagenet")
    features, _ = input_tensors(_dataset(cfg, batch=8, training=False, repeat=False))
    with pytest.raises(DataError, match="record 38: 'image/encoded' does not decode"), \
            input_errors(path), quick_session() as session:
        for _ in range(6):
            session.run(features)


def test_model_errors_are_not_taken_for_data_errors(graph):
    with pytest.raises(tf.errors.InvalidArgumentError), input_errors("data"), \
            quick_session() as session:
        session.run(tf.debugging.assert_equal(1, 2))
