"""`towers eval`: every example of a finite evaluation set scored exactly once, in file
order, weighed by example; eval.steps a cap; generated sources a fixed number of batches."""

import glob
import os
import shutil
import signal
import threading

import numpy as np
import pytest
import tensorflow as tf
from helpers.commands import ok, run_in_process

from launch.config import from_dict
from launch.runtime import checkpoint_lock

FEATURES, CLASSES = 4, 3
# 10 examples in batches of 4 over 3 towers: batches of 4, 4 and 2, the last one smaller
# than the towers, so one tower gets no example of it.
JOB = ["--set", "model.name=mlp", "--set", f"model.input_dim={FEATURES}",
       "--set", f"model.num_classes={CLASSES}", "--set", "model.hidden_units=[5]",
       "--set", "towers.devices=3", "--set", "train.batch_size=4", "--set", "train.steps=3",
       "--set", "eval.batch_size=4"]


def examples(n=10, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, n).astype(np.int64)
    return x, y


def write_csv(path, x, y):
    header = ",".join([f"f{i}" for i in range(FEATURES)] + ["label"])
    rows = [",".join([f"{v:.6f}" for v in row] + [str(label)])
            for row, label in zip(x, y, strict=True)]
    path.write_text("\n".join([header, *rows]) + "\n")


def write_tfrecord(path, x, y):
    with tf.io.TFRecordWriter(str(path)) as writer:
        for row, label in zip(x, y, strict=True):
            example = tf.train.Example(features=tf.train.Features(feature={
                "features": tf.train.Feature(float_list=tf.train.FloatList(value=row)),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))}))
            writer.write(example.SerializeToString())


def data_files(tmp_path, source, x, y) -> list[str]:
    """The examples as the source's files, in two files (6 and 4 examples) where the
    format allows: their order is the order the evaluation must keep."""
    if source == "npz":
        np.savez(tmp_path / "eval.npz", features=x, labels=y)
        return ["--set", "data.source=npz", "--set", f"data.path={tmp_path / 'eval.npz'}"]
    write = write_csv if source == "csv" else write_tfrecord
    write(tmp_path / f"eval-0.{source}", x[:6], y[:6])
    write(tmp_path / f"eval-1.{source}", x[6:], y[6:])
    return ["--set", f"data.source={source}", "--set", f"data.path={tmp_path}/eval-*.{source}"]


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
    """A trained checkpoint of the job's model, at step 3."""
    ckpt = tmp_path_factory.mktemp("trained") / "ckpt"
    ok(run_in_process("train", *JOB, "--set", "data.source=synthetic",
                      "--set", f"train.checkpoint_dir={ckpt}"))
    return ckpt


def numpy_scores(ckpt, x, y):
    """The model's probabilities, mean loss and accuracy over x, y, computed in numpy from
    the checkpoint's variables."""
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(ckpt)))
    kernel, bias = (reader.get_tensor(f"mlp/hidden0/{n}") for n in ("kernel", "bias"))
    hidden = np.maximum(x.astype(np.float64) @ kernel + bias, 0)
    kernel, bias = (reader.get_tensor(f"mlp/logits/{n}") for n in ("kernel", "bias"))
    logits = hidden @ kernel + bias
    logits -= logits.max(axis=1, keepdims=True)
    probabilities = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    loss = -np.log(probabilities[np.arange(len(y)), y]).mean()
    accuracy = (probabilities.argmax(axis=1) == y).mean()
    return probabilities, loss, accuracy


def evaluate(ckpt, *args):
    return run_in_process("eval", *JOB, "--set", f"train.checkpoint_dir={ckpt}", *args)


@pytest.mark.parametrize("source", ["csv", "npz", "tfrecord"])
def test_eval_scores_every_example_once_in_file_order(tmp_path, checkpoint_dir, source):
    x, y = examples()
    predictions = tmp_path / "p.npy"
    run = evaluate(checkpoint_dir, *data_files(tmp_path, source, x, y),
                   "--predictions", str(predictions))
    result = ok(run)
    probabilities, loss, accuracy = numpy_scores(checkpoint_dir, x, y)
    assert result["examples"] == 10 and "note" not in result
    np.testing.assert_allclose(np.load(predictions), probabilities, atol=1e-5)
    assert result["loss"] == pytest.approx(loss, rel=1e-5)
    assert result["accuracy"] == pytest.approx(accuracy)
    assert "evaluating every example of" in run.stderr and "(10 examples)" in run.stderr


def test_eval_steps_caps_the_batches(tmp_path, checkpoint_dir):
    x, y = examples()
    predictions = tmp_path / "p.npy"
    run = evaluate(checkpoint_dir, *data_files(tmp_path, "csv", x, y), "--set", "eval.steps=2",
                   "--predictions", str(predictions))
    result = ok(run)
    probabilities, loss, _ = numpy_scores(checkpoint_dir, x[:8], y[:8])
    assert result["examples"] == 8
    np.testing.assert_allclose(np.load(predictions), probabilities, atol=1e-5)
    assert result["loss"] == pytest.approx(loss, rel=1e-5)
    assert "evaluating at most 2 batches of 4 of" in run.stderr


def test_data_epochs_does_not_change_what_eval_scores(tmp_path, checkpoint_dir):
    x, y = examples()
    result = ok(evaluate(checkpoint_dir, *data_files(tmp_path, "npz", x, y),
                         "--set", "data.epochs=3"))
    assert result["examples"] == 10


@pytest.mark.parametrize("steps, scored", [(None, 20 * 4), (3, 3 * 4)])
def test_synthetic_data_is_scored_on_a_fixed_number_of_batches_and_says_so(
        checkpoint_dir, steps, scored):
    cap = [] if steps is None else ["--set", f"eval.steps={steps}"]
    run = evaluate(checkpoint_dir, "--set", "data.source=synthetic", *cap)
    result = ok(run)
    assert result["examples"] == scored
    assert result["note"].startswith("data.source synthetic repeats one generated batch")
    assert run.stderr.count(result["note"]) == 1


def test_builtin_data_is_scored_on_a_fixed_number_of_batches_never_twice(checkpoint_dir):
    # 20 batches of 4 would be 80 examples; the held-out split has 10, each scored once.
    run = evaluate(checkpoint_dir, "--set", "data.source=builtin", "--set", "data.num_examples=10")
    result = ok(run)
    assert result["examples"] == 10
    assert "an evaluation scores the first 10, at most 20 batches of 4" in result["note"]


def test_eval_steps_is_optional_and_positive():
    assert from_dict({}).eval.steps is None
    assert from_dict({"eval": {"steps": None}}).eval.steps is None
    refused = run_in_process("validate", "--set", "eval.steps=0")
    assert refused.returncode == 2 and "eval.steps" in refused.stderr


def test_an_evaluation_set_with_no_examples_is_bad_input(tmp_path, checkpoint_dir):
    (tmp_path / "empty.csv").write_text(",".join([f"f{i}" for i in range(FEATURES)]
                                                 + ["label"]) + "\n")
    run = evaluate(checkpoint_dir, "--set", "data.source=csv",
                   "--set", f"data.path={tmp_path / 'empty.csv'}",
                   "--predictions", str(tmp_path / "p.npy"))
    assert run.returncode == 2 and run.stdout == ""
    last = run.stderr.splitlines()[-1]
    assert f"{tmp_path / 'empty.csv'}: no examples" in last, last
    assert not (tmp_path / "p.npy").exists()


def test_eval_help_says_what_an_evaluation_reads():
    shown = run_in_process("eval", "--help").stdout
    assert "every example" in shown and "eval.steps" in shown and '"examples"' in shown


# --- a watch stopped by SIGTERM ---------------------------------------------------------

def watch_job(ckpt, **sections):
    return from_dict({
        "model": {"name": "mlp", "input_dim": FEATURES, "num_classes": CLASSES,
                  "hidden_units": [5]},
        "data": {"source": "synthetic"}, "towers": {"devices": 3},
        "train": {"steps": 3, "batch_size": 4, "checkpoint_dir": str(ckpt)},
        "eval": {"batch_size": 4, "steps": 2, "every_secs": 0.1}, **sections})


def copy_checkpoint(source_dir, step, target_dir):
    """Checkpoint `step` of source_dir into target_dir as a trainer saves it: the files,
    then the state file naming it the latest."""
    for name in glob.glob(str(source_dir / f"model.ckpt-{step}.*")):
        shutil.copy(name, target_dir)
    tf.compat.v1.train.update_checkpoint_state(str(target_dir), f"model.ckpt-{step}")


class Said:
    """A write callback: every line kept, and an event per awaited phrase."""

    def __init__(self, *phrases):
        self.lines = []
        self.events = {phrase: threading.Event() for phrase in phrases}

    def __call__(self, line):
        self.lines.append(line)
        for phrase, event in self.events.items():
            if phrase in line:
                event.set()

    def wait(self, phrase):
        assert self.events[phrase].wait(timeout=120), f"never said {phrase!r}: {self.lines}"


def test_a_stopped_watch_scores_the_final_checkpoint_of_a_stopping_trainer(tmp_path,
                                                                          checkpoint_dir):
    # As in a ps/worker job stopped with SIGTERM to every task: the chief still holds
    # checkpoint_dir when the evaluator is stopped, and saves its final checkpoint after.
    from launch.runtime.evaluate import evaluate

    watched = tmp_path / "ckpt"
    watched.mkdir()
    copy_checkpoint(checkpoint_dir, 0, watched)
    said = Said("eval step 0:", "to save its final checkpoint")

    def trainer_ending():
        said.wait("eval step 0:")
        with checkpoint_lock.hold(str(watched), said):
            os.kill(os.getpid(), signal.SIGTERM)
            said.wait("to save its final checkpoint")
            copy_checkpoint(checkpoint_dir, 3, watched)

    trainer = threading.Thread(target=trainer_ending, daemon=True)
    trainer.start()
    result = evaluate(watch_job(watched), watch=True, write=said)
    trainer.join(timeout=60)
    assert result["global_step"] == 3 and result["examples"] == 8
    assert f"scoring {watched / 'model.ckpt-3'}, the newest checkpoint, before stopping" in (
        said.lines)
    assert [line for line in said.lines if line.startswith("eval step")][-1].startswith(
        "eval step 3:")


def test_a_stopped_watch_with_nothing_new_to_score_stops_at_once(tmp_path, checkpoint_dir):
    from launch.runtime.evaluate import evaluate

    watched = tmp_path / "ckpt"
    watched.mkdir()
    copy_checkpoint(checkpoint_dir, 0, watched)
    said = Said("eval step 0:")
    stopper = threading.Thread(target=lambda: (said.wait("eval step 0:"),
                                               os.kill(os.getpid(), signal.SIGTERM)))
    stopper.start()
    result = evaluate(watch_job(watched), watch=True, write=said)
    stopper.join(timeout=60)
    assert result["global_step"] == 0
    assert "no checkpoint newer than the last one scored; stopping" in said.lines
    assert not any("waiting" in line for line in said.lines)


def test_a_stop_raised_while_tensorflow_makes_the_end_of_data_error_still_stops(
        tmp_path, checkpoint_dir, monkeypatch):
    """SIGTERM as TensorFlow's C++ makes the OutOfRangeError that ends an evaluation pass:
    the watch's stop, raised inside that error's __init__, reached it as pybind11's
    RuntimeError ("REPLACED BY _Stop"), a traceback and exit 1. The watch stops as on
    any stop: it scores the newest checkpoint once more, then ends."""
    from tensorflow.python.framework import errors_impl

    from launch.runtime.evaluate import evaluate

    watched = tmp_path / "ckpt"
    watched.mkdir()
    copy_checkpoint(checkpoint_dir, 3, watched)
    made = errors_impl.OutOfRangeError.__init__
    signalled = []

    def meets_sigterm(self, *args, **kwargs):
        if not signalled:  # the first pass's end only
            signalled.append(True)
            os.kill(os.getpid(), signal.SIGTERM)  # its handler runs before the next line
        made(self, *args, **kwargs)

    monkeypatch.setattr(errors_impl.OutOfRangeError, "__init__", meets_sigterm)
    x, y = examples()
    write_csv(tmp_path / "eval.csv", x, y)
    job = watch_job(watched, data={"source": "csv", "path": str(tmp_path / "eval.csv")},
                    eval={"batch_size": 4, "every_secs": 0.1})  # to the data's end
    said = Said()
    result = evaluate(job, watch=True, write=said)
    assert signalled and "stopping on signal; a second one stops at once" in said.lines
    assert result["global_step"] == 3 and result["examples"] == 10
