"""What `towers eval` computes in: float32 by default, as the exported model does, so a
mixed_bfloat16 job's evaluation and its SavedModel agree to 1e-5 (they differed by
1.08e-3: eval wrote bfloat16-rounded probabilities); eval.precision: training computes
in the job's 16 bits, and says the scores then differ from the export's."""

import numpy as np
import pytest
import tensorflow as tf
from helpers.data_files import write_four_class_npz

from launch.config import from_dict
from launch.runtime.evaluate import evaluate
from launch.runtime.export import export
from launch.runtime.train import train


@pytest.fixture(scope="module")
def bfloat16_job(tmp_path_factory):
    """A digits-sized MLP trained 20 steps in mixed_bfloat16 on an npz, and its export."""
    work = tmp_path_factory.mktemp("bf16")
    features = write_four_class_npz(work / "d.npz")
    raw = {"model": {"name": "mlp", "input_dim": 16, "hidden_units": [32], "num_classes": 4},
           "data": {"source": "npz", "path": str(work / "d.npz")},
           "towers": {"devices": 2, "precision": "mixed_bfloat16"},
           "optimizer": {"learning_rate": 0.1},
           "train": {"batch_size": 32, "steps": 20, "checkpoint_dir": str(work / "ckpt")},
           "eval": {"batch_size": 40}}
    quiet = lambda line: None  # noqa: E731
    train(from_dict(raw), write=quiet)
    export(from_dict(raw), str(work / "served"), write=quiet)
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], str(work / "served"))
        signature = meta.signature_def["serving_default"]
        served = sess.run(signature.outputs["predictions"].name,
                          {signature.inputs["features"].name: features})
    return raw, work, served


def scored(raw, work, name, **eval_section):
    lines = []
    job = from_dict({**raw, "eval": {**raw["eval"], **eval_section}})
    result = evaluate(job, write=lines.append, predictions=str(work / f"{name}.npy"))
    return result, np.load(work / f"{name}.npy"), lines


def test_eval_computes_in_float32_and_agrees_with_the_export(bfloat16_job):
    raw, work, served = bfloat16_job
    result, predicted, lines = scored(raw, work, "float32")
    assert result["precision"] == "float32"
    assert ("evaluating in float32, as the exported model computes (eval.precision: float32; "
            "'training' computes in mixed_bfloat16)") in lines
    np.testing.assert_allclose(predicted, served, atol=1e-5)


def test_eval_in_the_training_precision_says_so_and_differs_by_its_rounding(bfloat16_job):
    raw, work, served = bfloat16_job
    result, predicted, lines = scored(raw, work, "training", precision="training")
    assert result["precision"] == "mixed_bfloat16"
    assert any(line.startswith("evaluating in mixed_bfloat16, the training precision") for line
               in lines)
    difference = np.abs(predicted - served).max()
    assert 1e-5 < difference < 2e-2, difference  # bfloat16 keeps 8 bits of mantissa
