"""`towers bench --input`: the data it writes, the rows it builds, the report."""

from __future__ import annotations

import numpy as np
import pytest

from launch.bench.input import input_report, input_spec_of, write_inputs
from launch.bench.input_case import build_input_case
from launch.bench.settings import Row, Settings
from launch.config import from_dict
from launch.data import input_tensors, make_dataset

SMALL = {"filters": [4], "dense_units": 8}
SETTINGS = Settings("convnet", SMALL, batch=16, towers=(1,), modes=("parameter_server",), steps=2,
                    warmup=1, repeats=1)


@pytest.fixture(scope="module")
def sections(tmp_path_factory):
    directory = tmp_path_factory.mktemp("inputs")
    return write_inputs(input_spec_of(SETTINGS), str(directory), count=64)


def _first_batch(section: dict, spec) -> np.ndarray:
    import tensorflow as tf

    cfg = from_dict({"data": section}).data
    with tf.Graph().as_default():
        dataset = make_dataset(cfg.source, spec, 64, path=cfg.path, schema=cfg.schema,
                               image=from_dict({"data": {"image": {
                                   "mean": 0, "std": 1, "eval_crop": 1.0}}}).data.image,
                               training=False, repeat=False, shuffle_buffer=0)
        features, _ = input_tensors(dataset)
        with tf.compat.v1.Session() as session:
            return session.run(features)


def test_every_file_input_holds_the_models_images(sections):
    spec = input_spec_of(SETTINGS)
    assert set(sections) == {"synthetic", "npz", "csv", "tfrecord float", "tfrecord raw", "jpeg"}
    floats = _first_batch(sections["tfrecord float"], spec)
    npz, csv = (_first_batch(sections[name], spec) for name in ("npz", "csv"))
    assert np.allclose(npz, csv, atol=1e-5)  # the same pixels, held in memory
    # the TFRecords stripe the examples over their files: the same images, in another order
    assert np.allclose(np.sort(npz.sum(axis=(1, 2, 3))), np.sort(floats.sum(axis=(1, 2, 3))),
                       atol=1e-3)
    raw = _first_batch(sections["tfrecord raw"], spec)
    jpeg = _first_batch(sections["jpeg"], spec)
    assert floats.shape == raw.shape == jpeg.shape == (64, 28, 28, 1)
    assert np.allclose(floats, raw, atol=1e-6)  # the same pixels, stored two ways
    assert 0 <= jpeg.min() and jpeg.max() <= 1 and jpeg.std() > 0.05


# the synthetic input is timed with the model only: alone it costs nothing
@pytest.mark.parametrize("name, pipeline_only", [
    ("synthetic", False), ("npz", False), ("csv", False), ("tfrecord raw", False), ("jpeg", False),
    ("tfrecord raw", True), ("jpeg", True)])
def test_rows_build_and_run(sections, name, pipeline_only):
    case = build_input_case({"model": "convnet", "params": SMALL, "batch": 16, "devices": 1,
                             "data": sections[name], "pipeline_only": pipeline_only})
    case.run(2)


def test_report_gives_ratios_and_host_cost():
    training = [Row("synthetic", 1, rates=[400.0, 410.0, 390.0]),
                Row("jpeg", 1, rates=[200.0, 220.0])]
    training[0].cpu_ms_per_example, training[1].cpu_ms_per_example = 4.0, 5.0
    alone = Row("jpeg (input alone, 1 thread)", 1, rates=[2000.0])
    alone.cpu_ms_per_example = 0.5
    report = input_report(training, [alone])
    assert "| jpeg | 1 | 210 | 200 | 220 | 0.525 | 5.000 | 1.250 | 1.05 |" in report
    assert "| jpeg | 2000 | 2000 | 2000 | 0.5000 | 0.20 |" in report  # 400 ex/s * 0.5 ms


def test_jpeg_decode_costs_compare_fused_and_plain_decoding():
    from launch.bench.jpeg import decode_costs, decode_report

    rows = decode_costs((32,), channels=3)
    assert rows[0]["side"] == 32 and rows[0]["bytes"] > 100
    assert rows[0]["fused"] > 0 and rows[0]["decode, then crop"] > 0
    assert decode_report(rows).splitlines()[2].startswith("| 32 | ")
