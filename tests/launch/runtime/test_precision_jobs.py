"""Precision and accumulation in whole `towers train` jobs, run in this process.

Checkpoints are float32 in every precision and restore across them; a float16 job
whose loss scale overflows skips those steps, says so, counts them in its result and
metrics, and neither stops nor fails. A 16-bit type whose kernels this machine runs slower
than float32 is said at start-up.
"""

import json
import shutil

import numpy as np
import pytest
import tensorflow as tf
from helpers.checkpoints import checkpoint_variables
from prometheus_client import generate_latest

from launch import kernels, metrics
from launch.config import from_dict
from launch.runtime.export import export
from launch.runtime.train import train

MLP = {"model": {"name": "mlp", "input_dim": 8, "hidden_units": [8], "num_classes": 2},
       "data": {"source": "synthetic", "num_examples": 256},
       "towers": {"devices": 2}}


def run(ckpt, steps, lines=None, exporter=None, **sections):
    """Train the small job to `steps` in `ckpt`; sections update its job file's sections."""
    raw = {key: dict(value) for key, value in MLP.items()}
    raw["train"] = {"batch_size": 16, "steps": steps, "log_every_steps": 5,
                    "checkpoint_dir": str(ckpt)}
    for section, values in sections.items():
        raw.setdefault(section, {}).update(values)
    write = lines.append if lines is not None else (lambda line: None)
    return train(from_dict(raw), exporter=exporter, write=write)


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    """One checkpoint directory trained on in every precision in turn: (results, the
    variables each job left, a copy of the directory after each job)."""
    directory = tmp_path_factory.mktemp("resumed")
    results, variables, copies = [], [], []
    for steps, precision in [(3, "float32"), (6, "mixed_float16"), (9, "mixed_bfloat16"),
                             (12, "float32")]:
        results.append(run(directory / "ckpt", steps, towers={"precision": precision}))
        variables.append(checkpoint_variables(directory / "ckpt"))
        copies.append(shutil.copytree(directory / "ckpt", directory / f"after-{steps}"))
    return results, variables, copies


def test_one_checkpoint_directory_resumes_in_every_precision(resumed):
    results, variables, _ = resumed
    names = None
    for result, values, steps, precision in zip(
            results, variables, (3, 6, 9, 12),
            ("float32", "mixed_float16", "mixed_bfloat16", "float32"), strict=True):
        assert (result["global_step"], result["precision"]) == (steps, precision)
        assert {v.dtype.name for v in values.values()} == {"float32", "int64"}
        assert names in (None, sorted(values))  # the same variables, whatever the precision
        names = sorted(values)
    assert "loss_scale/loss_scale" not in names


def test_export_serves_a_bfloat16_jobs_checkpoint_in_float32(resumed, tmp_path):
    bfloat16_checkpoint = resumed[2][2]  # the directory as the mixed_bfloat16 job left it
    raw = {**MLP, "train": {"checkpoint_dir": str(bfloat16_checkpoint)},
           "towers": {"devices": 2, "precision": "mixed_bfloat16"}}
    export(from_dict(raw), str(tmp_path / "served"), write=lambda line: None)
    features = np.random.default_rng(0).normal(size=(5, 8)).astype(np.float32)
    with tf.Graph().as_default() as graph, tf.compat.v1.Session() as sess:
        meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], str(tmp_path / "served"))
        signature = meta.signature_def["serving_default"]
        served = sess.run(signature.outputs["predictions"].name,
                          {signature.inputs["features"].name: features})
        types = {op.get_attr(key) for op in graph.get_operations() for key in ("T", "DstT")
                 if op.node_def.attr[key].HasField("type")}
    assert tf.bfloat16 not in types and tf.float32 in types
    assert served.dtype == np.float32 and served.shape == (5, 2)
    np.testing.assert_allclose(served.sum(axis=1), 1.0, rtol=1e-6)


def test_a_bfloat16_job_warm_starts_from_a_float32_checkpoint(resumed, tmp_path):
    float32_checkpoint = resumed[2][0]  # as the first, float32, job left it
    source = checkpoint_variables(float32_checkpoint)
    # A step too small to move anything: what the job holds after it is what it started from.
    run(tmp_path / "target", 1, towers={"precision": "mixed_bfloat16"},
        optimizer={"learning_rate": 1e-12},
        train={"warm_start": str(float32_checkpoint)})
    target = checkpoint_variables(tmp_path / "target")
    model = [name for name in source if name.startswith("mlp/") and "Momentum" not in name]
    assert model
    for name in model:
        np.testing.assert_allclose(target[name], source[name], atol=1e-6, err_msg=name)


@pytest.mark.parametrize("on_nonfinite", ["stop", "skip"])
def test_loss_scale_overflows_are_skipped_reported_and_counted_not_divergence(
        tmp_path, on_nonfinite):
    lines = []
    exporter = metrics.start(from_dict({"metrics": {"port": 0}}).metrics,
                             metrics.Identity("train", 0, "test"), lines.append)
    try:
        # 2**40 overflows float16 at once; each skipped step halves the scale. More
        # overflows than max_nonfinite_steps: had they counted, "skip" would stop.
        result = run(tmp_path, 25, lines, exporter,
                     towers={"precision": "mixed_float16", "loss_scale": {"initial": 2.0**40}},
                     train={"on_nonfinite": on_nonfinite, "max_nonfinite_steps": 2})
        text = generate_latest(exporter.registry).decode()
    finally:
        exporter.close(final_scrape=False)
    assert result["global_step"] == 25 and 3 <= result["overflow_steps"] < 25
    assert result["loss_scale"] <= 2.0**40 / 2 ** result["overflow_steps"]
    overflowed = [line for line in lines if "overflowed at loss scale" in line]
    assert len(overflowed) == result["overflow_steps"]
    assert not [line for line in lines if "non-finite loss or gradient; update skipped" in line]
    series = {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith("towers_")}
    assert series["towers_overflow_steps_total"] == result["overflow_steps"]
    assert series["towers_nonfinite_loss_total"] == 0
    assert 0 < series["towers_loss_scale"] <= 2.0**40  # sampled at most once a second


def test_the_start_up_line_and_result_name_precision_and_micro_batches(tmp_path):
    lines = []
    result = run(tmp_path, 2, lines, towers={"precision": "mixed_bfloat16"},
                 train={"accumulate_steps": 4, "batch_size": 32},
                 optimizer={"learning_rate": 0.1, "reference_batch_size": 16})
    start = next(line for line in lines if line.startswith("model mlp on 2 tower(s)"))
    assert start.endswith("; mixed_bfloat16, 4 micro-batches of 8 examples per update, "
                          "learning rate 0.2 (0.1 x 32 / 16)"), start
    assert (result["precision"], result["accumulate_steps"]) == ("mixed_bfloat16", 4)
    assert "loss_scale" not in result


def test_a_16_bit_type_measured_slower_is_noted_right_after_the_start_up_line(
        tmp_path, monkeypatch):
    # The first job's probe times its kernels into this machine's cache; the cache is
    # then made to say bfloat16 runs them 100 times slower than float32, whatever this
    # CPU does, and the next job reads that instead of timing them again.
    monkeypatch.setenv("TOWERS_CACHE_DIR", str(tmp_path / "cache"))
    run(tmp_path / "first", 1, towers={"precision": "mixed_bfloat16"})
    cache = kernels.cache_file()
    timings = json.loads(open(cache).read())
    assert timings and all(set(t) == {"float32", "bfloat16"} for t in timings.values())
    with open(cache, "w") as f:
        json.dump({key: {"float32": t["float32"], "bfloat16": 100 * t["float32"]}
                   for key, t in timings.items()}, f)
    lines = []
    run(tmp_path / "second", 1, lines, towers={"precision": "mixed_bfloat16"})
    start = next(i for i, line in enumerate(lines) if line.startswith("model mlp on 2 tower(s)"))
    assert lines[start + 1].startswith(
        "mixed_bfloat16: on this machine the model's convolutions and matrix products ran "
        "at 0.01x their float32 speed (forward 0.01x, gradients 0.01x; timed alone at "
        "start-up), so steps will likely be slower than in float32"), lines
    assert sum("their float32 speed" in line for line in lines) == 1


def test_the_closing_advice_offers_bfloat16_as_this_machine_measured_it(tmp_path, monkeypatch):
    # A float32 job's advice reads what an earlier bfloat16 job's probe timed for the
    # same kernels, whatever this CPU's flags say: the cache is made to say bfloat16
    # runs them 100 times slower, then 4 times faster. A wide mlp on batches of 256 on
    # one tower: steps of several milliseconds of matrix products, compute-bound. XLA,
    # for towers on GPUs, is proposed in neither.
    monkeypatch.setenv("TOWERS_CACHE_DIR", str(tmp_path / "cache"))
    wide = {"model": {"input_dim": 256, "hidden_units": [1024, 1024]},
            "data": {"num_examples": 1024}}
    run(tmp_path / "probed", 1, towers={"devices": 1, "precision": "mixed_bfloat16"},
        train={"batch_size": 256}, **wide)
    timings = json.loads(open(kernels.cache_file()).read())
    assert timings and all(set(t) == {"float32", "bfloat16"} for t in timings.values())
    for factor, offered in ((100.0, False), (0.25, True)):
        with open(kernels.cache_file(), "w") as f:
            json.dump({key: {"float32": t["float32"], "bfloat16": factor * t["float32"]}
                       for key, t in timings.items()}, f)
        lines = []
        run(tmp_path / f"float32-{factor}", 20, lines, towers={"devices": 1},
            train={"batch_size": 256, "phase_sample_secs": 0}, **wide)
        (said,) = [line for line in lines if line.startswith("advice: ")]
        assert said.startswith("advice: compute-bound"), lines
        assert ("mixed_bfloat16" in said) is offered, said
        assert "towers.xla" not in said, said  # towers on CPUs: XLA is not proposed
        if offered:
            assert ("try towers.precision: mixed_bfloat16 (this machine ran the model's "
                    "convolutions and matrix products at 4x their float32 speed in "
                    "bfloat16, timed at an earlier start-up)") in said, said
