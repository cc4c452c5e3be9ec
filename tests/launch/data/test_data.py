"""Input pipelines: every source, the builtin data set, TFRecord conversion, DataErrors."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import tensorflow as tf

from launch.data import (
    DataError,
    builtin_arrays,
    check_source,
    input_tensors,
    make_dataset,
)
from launch.data.converters import convert_arrays, shard_names
from models import InputSpec

IMAGE = InputSpec((28, 28, 1), tf.float32, (), tf.int32, 10)
FLAT = InputSpec((784,), tf.float32, (), tf.int32, 10)
CIFAR = InputSpec((32, 32, 3), tf.float32, (), tf.int32, 10)
TOKENS = InputSpec((20,), tf.int32, (20,), tf.int32, 50)
SMALL = InputSpec((2, 3), tf.float32, (), tf.int32, 4)  # 6 features, for file round trips


def _run(dataset: tf.data.Dataset, batches: int | None = None) -> list[tuple]:
    """Up to ``batches`` (features, labels) numpy pairs; None: until the dataset ends."""
    features, labels = input_tensors(dataset)
    out = []
    with tf.compat.v1.Session() as sess:
        while batches is None or len(out) < batches:
            try:
                out.append(sess.run([features, labels]))
            except tf.errors.OutOfRangeError:
                break
    return out


def _concat(batches: list[tuple]) -> tuple[np.ndarray, np.ndarray]:
    return np.concatenate([f for f, _ in batches]), np.concatenate([y for _, y in batches])


def _as_set(features: np.ndarray, labels: np.ndarray) -> collections.Counter:
    return collections.Counter(
        (f.tobytes(), y.tobytes()) for f, y in zip(features, labels, strict=True))


def _small_arrays(count: int = 48, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    features = rng.uniform(-1, 1, (count, *SMALL.feature_shape)).astype(np.float32)
    return features, rng.integers(0, SMALL.num_classes, count).astype(np.int32)


def _write_csv(path, features: np.ndarray, labels: np.ndarray, label_at: int = 2,
               header: list[str] | None = None) -> None:
    flat = features.reshape(len(features), -1)
    columns = [f"f{i}" for i in range(flat.shape[1])]
    columns.insert(label_at, "label")
    table = np.insert(flat.astype(object), label_at, labels, axis=1)
    rows = [",".join(header or columns)]
    rows += [",".join(repr(v) if isinstance(v, float) else str(v) for v in row) for row in table]
    path.write_text("\n".join(rows) + "\n")


# ----------------------------------------------------------------- shapes, dtypes


@pytest.mark.parametrize("source", ["synthetic", "builtin"])
@pytest.mark.parametrize("spec", [IMAGE, FLAT, CIFAR, TOKENS], ids=["image", "flat", "cifar",
                                                                    "tokens"])
def test_generated_sources_yield_spec_batches(graph, source, spec):
    dataset = make_dataset(source, spec, 32, num_examples=256, num_parallel_calls=2, prefetch=1)
    assert dataset.element_spec[0].shape.as_list() == [32, *spec.feature_shape]
    (x1, y1), (x2, y2) = _run(dataset, 2)
    assert x1.shape == (32, *spec.feature_shape) and x1.dtype == spec.feature_dtype
    assert y1.shape == (32, *spec.label_shape) and y1.dtype == spec.label_dtype
    assert 0 <= y1.min() and y1.max() < spec.num_classes
    if spec.feature_dtype.is_integer:
        assert 0 <= x1.min() and x1.max() < spec.num_classes
    # synthetic repeats its one batch; builtin moves on through shuffled examples
    assert np.array_equal(x1, x2) == (source == "synthetic")


@pytest.mark.parametrize("training", [True, False])
def test_no_pipeline_runs_tf_datas_autotuning_thread(graph, training):
    """Its thread held a job's end 4-50 s: an iterator's end waits for it, and it
    notices only when its period is up (launch.data.stream.pipeline_options)."""
    dataset = make_dataset("builtin", IMAGE, 32, training=training, num_examples=64)
    assert dataset.options().autotune.enabled is False


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("source", ["synthetic", "builtin", "npz", "csv", "tfrecord"])
def test_no_pipeline_function_goes_through_autograph(graph, tmp_path, monkeypatch, source,
                                                      training):
    """Its conversion cost a resnet20 start 0.13-0.47 s (loaded 2-core CPU), for
    functions written as plain graph code (launch.data.sources.base._not_autographed)."""
    from tensorflow.python.autograph.impl import api as autograph

    converted = []
    convert = autograph.converted_call

    def noted(f, *args, **kwargs):
        converted.append(getattr(f, "__qualname__", repr(f)))
        return convert(f, *args, **kwargs)

    monkeypatch.setattr(autograph, "converted_call", noted)
    features, labels = _small_arrays(40)
    np.savez(tmp_path / "set.npz", features=features, labels=labels)
    _write_csv(tmp_path / "set.csv", features, labels)
    files = {"npz": str(tmp_path / "set.npz"), "csv": str(tmp_path / "set.csv"),
             "tfrecord": convert_arrays("npz", SMALL, tmp_path / "set.npz",
                                        tmp_path / "out" / "set", 2).files}
    make_dataset(source, SMALL, 8, path=files.get(source), training=training,
                 num_examples=40)
    assert converted == []


def test_input_tensors_have_static_shapes(graph):
    features, labels = input_tensors(make_dataset("builtin", IMAGE, 16, num_examples=64))
    assert features.shape.as_list() == [16, 28, 28, 1] and features.dtype == tf.float32
    assert labels.shape.as_list() == [16] and labels.dtype == tf.int32


# ----------------------------------------------------------------------- builtin


def test_builtin_is_deterministic_with_a_held_out_split():
    train_x, train_y = builtin_arrays(IMAGE, 200, seed=3)
    again_x, again_y = builtin_arrays(IMAGE, 200, seed=3)
    eval_x, _ = builtin_arrays(IMAGE, 200, seed=3, training=False)
    other_x, _ = builtin_arrays(IMAGE, 200, seed=4)
    assert np.array_equal(train_x, again_x) and np.array_equal(train_y, again_y)
    assert not np.allclose(train_x, eval_x)
    assert not np.allclose(train_x, other_x)
    flat_x, _ = builtin_arrays(FLAT, 200, seed=3)
    assert np.array_equal(flat_x, train_x.reshape(200, 784))  # the same images, flattened
    tokens_x, tokens_y = builtin_arrays(TOKENS, 50, seed=3)
    assert np.array_equal(tokens_x[:, 1:], tokens_y[:, :-1])  # labels: next tokens


def test_shuffle_is_seeded():
    def first_labels(seed: int) -> np.ndarray:
        with tf.Graph().as_default():
            return _run(make_dataset("builtin", IMAGE, 32, num_examples=128, seed=seed), 1)[0][1]

    assert np.array_equal(first_labels(1), first_labels(1))
    assert not np.array_equal(first_labels(1), first_labels(2))


def test_builtin_images_are_learnable_but_not_trivial():
    train_x, train_y = builtin_arrays(FLAT, 4000, seed=0)
    eval_x, eval_y = builtin_arrays(FLAT, 2000, seed=0, training=False)
    # a ridge-regularised least-squares linear classifier on the pixels
    design = np.c_[train_x, np.ones(len(train_x))]
    weights = np.linalg.solve(design.T @ design + 10.0 * np.eye(design.shape[1]),
                              design.T @ np.eye(10)[train_y])
    linear = np.mean((np.c_[eval_x, np.ones(len(eval_x))] @ weights).argmax(1) == eval_y)
    # the best single pixel: nearest class mean of that pixel's value
    means = np.stack([train_x[train_y == c].mean(0) for c in range(10)])  # [10, 784]
    guesses = np.abs(eval_x[:, None, :] - means[None]).argmin(1)  # [N, 784]
    single_pixel = np.max(np.mean(guesses == eval_y[:, None], axis=0))
    assert np.bincount(train_y, minlength=10).min() > 300  # classes roughly balanced
    assert 0.6 < linear < 0.99, linear
    assert single_pixel < 0.4, single_pixel


def test_builtin_tokens_follow_a_learnable_markov_chain():
    train_x, train_y = builtin_arrays(TOKENS, 2000, seed=0)
    eval_x, eval_y = builtin_arrays(TOKENS, 500, seed=0, training=False)
    counts = np.zeros((TOKENS.num_classes, TOKENS.num_classes))
    np.add.at(counts, (train_x.ravel(), train_y.ravel()), 1)
    bigram = np.mean(counts.argmax(1)[eval_x] == eval_y)
    assert 0.5 < bigram < 0.75, bigram  # the likeliest successor has p ~ 0.6; chance 0.02


def test_builtin_eval_split_is_read_once_in_order(graph):
    dataset = make_dataset("builtin", IMAGE, 64, num_examples=150, training=False,
                           repeat=False)
    features, labels = _concat(_run(dataset))
    expected_x, expected_y = builtin_arrays(IMAGE, 150, training=False)
    assert np.array_equal(features, expected_x) and np.array_equal(labels, expected_y)


def test_builtin_rejects_specs_it_cannot_serve():
    with pytest.raises(DataError, match="builtin"):
        check_source("builtin", InputSpec((20,), tf.int32, (), tf.int32, 10))


# ------------------------------------------------------------------ file sources


@pytest.mark.parametrize("keys", [("features", "labels"), ("x", "y")])
def test_npz_round_trip(graph, tmp_path, keys):
    features, labels = _small_arrays()
    path = tmp_path / "set.npz"
    np.savez(path, **{keys[0]: features.reshape(48, 6), keys[1]: labels})
    check_source("npz", SMALL, path)
    read = _concat(_run(make_dataset("npz", SMALL, 16, path=path, training=False,
                                     repeat=False)))
    assert np.array_equal(read[0], features) and np.array_equal(read[1], labels)
    shuffled = _concat(_run(make_dataset("npz", SMALL, 16, path=path, repeat=False, seed=5)))
    assert _as_set(*shuffled) == _as_set(features, labels)
    assert not np.array_equal(shuffled[1], labels)


@pytest.mark.parametrize("source", ["npz", "csv"])
def test_shards_are_disjoint_and_cover_the_data(graph, tmp_path, source):
    features, labels = _small_arrays()
    np.savez(tmp_path / "set.npz", features=features.reshape(48, 6), labels=labels)
    path = tmp_path / "set.npz"
    if source == "csv":
        path = tmp_path / "set.csv"
        _write_csv(path, features.reshape(48, 6), labels)
    parts = [_as_set(*_concat(_run(make_dataset(source, SMALL, 4, path=path, repeat=False,
                                                 seed=1, shard=(i, 3)))))
             for i in range(3)]
    assert all(len(part) == 16 for part in parts)
    assert not (parts[0] & parts[1] or parts[1] & parts[2] or parts[0] & parts[2])
    assert parts[0] | parts[1] | parts[2] == _as_set(features, labels)


def test_csv_round_trip(graph, tmp_path):
    features, labels = _small_arrays()
    path = tmp_path / "set.csv"
    _write_csv(path, features, labels)
    check_source("csv", SMALL, str(path))
    read = _concat(_run(make_dataset("csv", SMALL, 16, path=str(path), training=False,
                                     repeat=False)))
    assert read[0].dtype == np.float32 and read[1].dtype == np.int32
    assert np.array_equal(read[0], features) and np.array_equal(read[1], labels)
    batches = _run(make_dataset("csv", SMALL, 16, path=str(path), seed=2), 6)  # 2 epochs
    assert _as_set(*_concat(batches[:3])) == _as_set(features, labels)


def test_tfrecord_shards_give_every_example_once_per_epoch(graph, tmp_path):
    features, labels = _small_arrays(60)
    np.savez(tmp_path / "set.npz", features=features, labels=labels)
    prefix = tmp_path / "out" / "set"
    files = convert_arrays("npz", SMALL, tmp_path / "set.npz", prefix, 3).files
    assert files == shard_names(prefix, 3)
    assert files[2].endswith("set-00002-of-00003.tfrecord")
    glob = str(tmp_path / "out" / "set-*-of-00003.tfrecord")
    check_source("tfrecord", SMALL, glob)
    expected = _as_set(features, labels)
    for training in (True, False):
        dataset = make_dataset("tfrecord", SMALL, 20, path=glob, training=training,
                               repeat=False, shuffle_buffer=16)
        assert _as_set(*_concat(_run(dataset))) == expected
    two_epochs = _run(make_dataset("tfrecord", SMALL, 20, path=files, seed=1), 6)
    assert _as_set(*_concat(two_epochs[:3])) == expected
    assert _as_set(*_concat(two_epochs[3:])) == expected


def test_convert_csv_token_sequences(graph, tmp_path):
    tokens_x, tokens_y = builtin_arrays(TOKENS, 30, seed=0)
    np.savez(tmp_path / "lm.npz", x=tokens_x, y=tokens_y)
    files = convert_arrays("npz", TOKENS, str(tmp_path / "lm.npz"), tmp_path / "lm", 2).files
    read = _concat(_run(make_dataset("tfrecord", TOKENS, 10, path=files, training=False,
                                     repeat=False)))
    assert _as_set(*read) == _as_set(tokens_x, tokens_y)
    features, labels = _small_arrays()
    _write_csv(tmp_path / "set.csv", features, labels, label_at=0)
    files = convert_arrays("csv", SMALL, tmp_path / "set.csv", tmp_path / "csv", 2).files
    read = _concat(_run(make_dataset("tfrecord", SMALL, 8, path=files, training=False,
                                     repeat=False)))
    assert _as_set(*read) == _as_set(features, labels)


# ------------------------------------------------------------------- DataErrors


def _error(source, spec, path, **kwargs) -> str:
    with pytest.raises(DataError) as info:
        check_source(source, spec, path, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("source", ["npz", "csv", "tfrecord"])
def test_missing_file_and_empty_glob(tmp_path, source):
    missing = str(tmp_path / f"nope.{source}")
    assert missing in _error(source, SMALL, missing)
    assert "no such file" in _error(source, SMALL, missing)
    pattern = str(tmp_path / "none-*.data")
    message = _error(source, SMALL, pattern)
    assert pattern in message and "matches no files" in message
    assert "needs a path" in _error(source, SMALL, None)
    with pytest.raises(DataError, match="no such file"):
        make_dataset(source, SMALL, 4, path=missing)


def test_csv_header_errors(tmp_path):
    features, labels = _small_arrays(4)
    no_label = tmp_path / "no_label.csv"
    _write_csv(no_label, features, labels, header=[f"c{i}" for i in range(7)])
    message = _error("csv", SMALL, no_label)
    assert str(no_label) in message and "no label column 'label'" in message
    assert "'target'" in _error("csv", SMALL, no_label, label_column="target")
    wide = tmp_path / "wide.csv"
    _write_csv(wide, np.zeros((4, 9), np.float32), labels)
    message = _error("csv", SMALL, wide)
    assert str(wide) in message and "9 feature columns" in message and "takes 6" in message


def test_npz_errors(tmp_path):
    features, labels = _small_arrays(8)
    unnamed = tmp_path / "unnamed.npz"
    np.savez(unnamed, images=features, classes=labels)
    message = _error("npz", SMALL, unnamed)
    assert str(unnamed) in message and "'features' and 'labels'" in message
    wrong_shape = tmp_path / "wrong_shape.npz"
    np.savez(wrong_shape, features=np.zeros((8, 5), np.float32), labels=labels)
    message = _error("npz", SMALL, wrong_shape)
    assert str(wrong_shape) in message and "shape (8, 5)" in message
    with pytest.raises(DataError, match="shape"):
        make_dataset("npz", SMALL, 4, path=wrong_shape)
    wrong_dtype = tmp_path / "wrong_dtype.npz"
    np.savez(wrong_dtype, features=(features * 100).astype(np.uint8), labels=labels)
    assert "dtype uint8" in _error("npz", SMALL, wrong_dtype)
    not_npz = tmp_path / "text.npz"
    not_npz.write_text("features,labels\n")
    assert "not an npz file" in _error("npz", SMALL, not_npz)
    bad_labels = tmp_path / "bad_labels.npz"
    np.savez(bad_labels, features=features, labels=labels + SMALL.num_classes)
    assert "outside [0, 4)" in _error("npz", SMALL, bad_labels)


def test_out_of_range_label_anywhere_is_found_before_training(graph, tmp_path):
    features, labels = _small_arrays(32)
    labels[20] = SMALL.num_classes  # past the rows the first check once read
    path = tmp_path / "late.csv"
    _write_csv(path, features, labels)
    assert "late.csv: line 22, column 'label': label 4 is outside [0, 4)" in _error(
        "csv", SMALL, path)
    with pytest.raises(DataError, match="line 22"):
        make_dataset("csv", SMALL, 32, path=path, training=False, repeat=False)


def test_npz_class_count_comes_from_its_labels(tmp_path):
    from launch.config import load_job
    from launch.data import resolve_input_spec

    features, labels = _small_arrays(48)
    np.savez(tmp_path / "set.npz", features=features, labels=labels % 3)
    cfg = load_job(None, ["data.source=npz", f"data.path={tmp_path / 'set.npz'}"]).data
    with pytest.raises(DataError, match=r"4 vs 3 classes \(the largest label in .*set.npz, 2;"):
        resolve_input_spec("mlp", SMALL, cfg)
    stated = load_job(None, ["data.source=npz", f"data.path={tmp_path / 'set.npz'}",
                             "data.num_classes=4"]).data
    assert resolve_input_spec("mlp", SMALL, stated) == SMALL


def test_npz_without_examples(tmp_path):
    path = tmp_path / "empty.npz"
    np.savez(path, features=np.zeros((0, 6), np.float32), labels=np.zeros(0, np.int64))
    assert _error("npz", SMALL, path) == (f"{path}: no examples: 'features' has shape (0, 6), "
                                          "'labels' (0,)")


def test_npz_label_out_of_range_names_the_example(tmp_path):
    features, labels = _small_arrays(8)
    labels[5] = 9
    np.savez(tmp_path / "set.npz", features=features, labels=labels)
    assert "set.npz: example 5 (counted from 0) has label 9, outside [0, 4)" in _error(
        "npz", SMALL, tmp_path / "set.npz")


def test_tfrecord_feature_size_mismatch(tmp_path):
    features, labels = _small_arrays(8)
    np.savez(tmp_path / "set.npz", features=features, labels=labels)
    files = convert_arrays("npz", SMALL, tmp_path / "set.npz", tmp_path / "set", 1).files
    wider = InputSpec((7,), tf.float32, (), tf.int32, 4)
    message = _error("tfrecord", wider, files)
    assert f"{files[0]}: record 0" in message and "6 values, the schema needs 7" in message
    with pytest.raises(DataError, match="6 values"):
        make_dataset("tfrecord", wider, 4, path=files)


def test_corrupt_tfrecord_names_file_and_record(tmp_path):
    count = 40
    features, labels = _small_arrays(count)
    np.savez(tmp_path / "set.npz", features=features, labels=labels)
    files = convert_arrays("npz", SMALL, tmp_path / "set.npz", tmp_path / "set", 2).files
    raw = bytearray(open(files[1], "rb").read())
    record_size = len(raw) // (count // 2)  # equal-sized records: 6 floats, one small label
    assert record_size * (count // 2) == len(raw)
    corrupt_index = (count // 2) // 2
    middle = corrupt_index * record_size + record_size // 2
    raw[middle:middle + 4] = bytes(b ^ 0xFF for b in raw[middle:middle + 4])
    open(files[1], "wb").write(bytes(raw))
    message = _error("tfrecord", SMALL, str(tmp_path / "set-*.tfrecord"))
    assert f"{files[1]}: record {corrupt_index} is corrupt" in message


def test_bad_arguments():
    with pytest.raises(DataError, match="unknown data source 'parquet'"):
        check_source("parquet", SMALL)
    with pytest.raises(DataError, match="batch_size"):
        make_dataset("synthetic", SMALL, 0)
    with pytest.raises(DataError, match="num_parallel_calls"):
        make_dataset("synthetic", SMALL, 4, num_parallel_calls=-3)
