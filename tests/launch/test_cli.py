"""`towers train` / `eval` / `validate` / `devices` / `data convert`, end to end.

A command runs in a subprocess where the process is the point (a signal it gets, a
variable it starts with, a watcher beside a trainer); elsewhere it runs through the
command's own main() in this process (helpers/commands.run_in_process), which saves
each run the seconds of a new process importing TensorFlow."""

import os
import runpy
import signal
import time

import numpy as np
import pytest
import tensorflow as tf
import yaml
from helpers.checkpoints import latest_step
from helpers.commands import (
    FAST,
    ROOT,
    last_json,
    ok,
    run_in_process,
    start_towers,
)


def read_until(stream, text: str, seen: str = "", timeout: float = 120) -> str:
    """A process's output read line by line until `text` appears; all that was read."""
    deadline = time.monotonic() + timeout
    while text not in seen and time.monotonic() < deadline:
        line = stream.readline()
        if not line:  # the process has ended
            break
        seen += line
    assert text in seen, seen[-2000:]
    return seen


@pytest.mark.e2e
def test_default_job_trains_reports_json_writes_events_and_a_second_run_continues(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ckpt = tmp_path / "runs" / "default"
    summaries = ["--set", "train.summary_every_steps=5"]
    result = ok(run_in_process("train", *FAST, *summaries, "--set", "train.steps=10",
                               cwd=str(tmp_path)))
    assert result["global_step"] == 10
    assert np.isfinite(result["loss"]) and result["job_examples_per_sec"] > 0
    assert result["process_examples_per_sec"] == result["job_examples_per_sec"]  # one process
    assert 0.0 <= result["accuracy"] <= 1.0
    assert latest_step(ckpt) == 10

    second = run_in_process("train", *FAST, *summaries, "--set", "train.steps=25",
                            cwd=str(tmp_path))
    assert ok(second)["global_step"] == 25
    assert "step 20/25" in second.stderr and "step 10/25" not in second.stderr
    assert latest_step(ckpt) == 25

    events = EventAccumulator(str(ckpt))
    events.Reload()
    scalars = events.Tags()["scalars"]
    assert {"loss", "learning_rate", "accuracy", "job_examples_per_sec",
            "process_examples_per_sec"} <= set(scalars)
    losses = events.Scalars("loss")
    assert len(losses) >= 2 and all(np.isfinite(e.value) for e in losses)
    # The first step is traced, so TensorBoard's graph can show device placement.
    assert "first_step" in events.Tags()["run_metadata"]


@pytest.mark.e2e
def test_eval_watch_scores_checkpoints_as_they_appear_and_a_sigterm_saves_one_that_resumes(
        tmp_path):
    """`eval --watch` scores each checkpoint as it appears. A trainer stopped by SIGTERM
    with the watcher, as an orchestrator stops a whole job, saves a final checkpoint
    after the watcher got its signal; the watcher scores it before stopping, a later run
    resumes from it and `towers eval` scores that run's."""
    ckpt = tmp_path / "ckpt"
    args = [*FAST, "--set", f"train.checkpoint_dir={ckpt}", "--set", "eval.every_secs=1",
            "--set", "train.steps=100000"]
    stopping = [*args, "--set", "train.log_every_steps=1",
                "--set", "train.checkpoint_every_steps=100000"]
    watcher = start_towers("eval", *args, "--watch", "--timeout", "120")
    trainer = None
    try:
        # Two runs of 10 steps, the second once the watcher has scored the first's
        # checkpoint: each checkpoint is seen while it is the newest.
        scored = ""
        for steps in (10, 20):
            ok(run_in_process("train", *args, "--set", f"train.steps={steps}"))
            scored = read_until(watcher.stderr, f"eval step {steps}:", scored)
        trainer = start_towers("train", *stopping)
        read_until(trainer.stderr, "step 25/")
        trainer.send_signal(signal.SIGTERM)
        watcher.send_signal(signal.SIGTERM)
        trained, _ = trainer.communicate(timeout=120)
        out, err = watcher.communicate(timeout=120)
        err = scored + err
    finally:
        for proc in (watcher, trainer):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    assert trainer.returncode == 0 and watcher.returncode == 0, err[-2000:]
    stopped = last_json(trained)
    final = stopped["global_step"]
    assert stopped["stopped_by"] == "signal"
    assert latest_step(ckpt) == final >= 25 and last_json(out)["global_step"] == final
    assert "eval step 10:" in err and "eval step 20:" in err, err
    assert f"scoring {ckpt / f'model.ckpt-{final}'}, the newest checkpoint, before stopping" in err

    resumed = ok(run_in_process("train", *stopping, "--set", f"train.steps={final + 3}"))
    assert resumed["global_step"] == final + 3
    summaries = set(os.listdir(ckpt / "eval"))
    evaluated = ok(run_in_process("eval", *args))
    assert evaluated["global_step"] == resumed["global_step"]
    assert {"loss", "accuracy", "examples_per_sec"} <= set(evaluated)
    assert evaluated["examples"] == 2 * 32  # builtin data: eval.steps batches of eval.batch_size
    assert set(os.listdir(ckpt / "eval")) > summaries, "eval wrote no summaries"


def write_npz(path, n=64, dim=8, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, dim)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    np.savez(path, features=x, labels=y)
    return x, y


MLP = ["--set", "model.name=mlp", "--set", "model.input_dim=8", "--set", "model.num_classes=2",
       "--set", "model.hidden_units=[8]", "--set", "train.batch_size=16",
       "--set", "train.steps=6", "--set", "train.log_every_steps=2"]


@pytest.mark.e2e
@pytest.mark.parametrize("source", ["synthetic", "npz", "csv", "tfrecord"])
def test_each_data_source_feeds_training(tmp_path, source):
    x, y = write_npz(tmp_path / "d.npz")
    args = [*MLP, "--set", f"train.checkpoint_dir={tmp_path / 'ckpt'}"]
    if source == "npz":
        args += ["--set", "data.source=npz", "--set", f"data.path={tmp_path / 'd.npz'}"]
    elif source == "csv":
        header = ",".join([f"f{i}" for i in range(8)] + ["label"])
        rows = np.concatenate([x, y[:, None]], axis=1)
        np.savetxt(tmp_path / "d.csv", rows, delimiter=",", header=header, comments="",
                   fmt=["%.6f"] * 8 + ["%d"])
        args += ["--set", "data.source=csv", "--set", f"data.path={tmp_path / 'd.csv'}"]
    elif source == "tfrecord":
        npz = ["--set", "data.source=npz", "--set", f"data.path={tmp_path / 'd.npz'}"]
        converted = run_in_process("data", "convert", *args, *npz,
                                   "--out", str(tmp_path / "tf"), "--shards", "3")
        summary = ok(converted)
        assert len(summary["files"]) == 3 and summary["examples"] == 64
        args += ["--set", "data.source=tfrecord",
                 "--set", f"data.path={tmp_path / 'tf'}-*.tfrecord"]
    else:
        args += ["--set", "data.source=synthetic"]
    result = ok(run_in_process("train", *args))
    assert result["global_step"] == 6 and np.isfinite(result["loss"])


@pytest.mark.e2e  # in this process, but it builds the whole training graph (~1 s)
def test_validate_prints_the_resolved_job(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("model: {name: mlp, input_dim: 784}\ntrain: {steps: 7}\n")
    result = run_in_process("validate", "-c", str(job), "--set", "optimizer.name=adam")
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)
    assert resolved["train"]["steps"] == 7
    assert resolved["optimizer"]["name"] == "adam"
    assert resolved["model"]["name"] == "mlp"
    assert resolved["towers"]["devices"] == "auto"


def test_devices_lists_cpu_and_cuda_mapping(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    result = run_in_process("devices")
    assert result.returncode == 0, result.stderr
    assert "CUDA_VISIBLE_DEVICES=" in result.stdout
    assert "GPUs: none visible" in result.stdout
    assert "/cpu:0" in result.stdout


@pytest.mark.parametrize("command", [
    [], ["train"], ["eval"], ["validate"], ["devices"], ["data", "convert"], ["export"],
])
def test_help_has_examples(command):
    result = run_in_process(*command, "--help")
    assert result.returncode == 0
    assert "usage: towers" in result.stdout
    if command:
        assert "examples:" in result.stdout


@pytest.mark.e2e
def test_every_example_job_validates(tmp_path):
    # validate reads the data as train would: the digits examples' first, made as
    # docs/model.md says (examples/custom_model/digits.py writes runs/digits/).
    digits = np.load(os.path.join(ROOT, "tests", "data", "digits.npz"))
    runpy.run_path(os.path.join(ROOT, "examples", "custom_model", "digits.py"))["write"](
        digits["images"], digits["target"], str(tmp_path / "runs" / "digits"))
    root = os.path.join(ROOT, "examples")
    jobs = [os.path.join(folder, name) for folder, _, names in os.walk(root)
            for name in sorted(names) if name.endswith(".yaml")]
    assert len(jobs) >= 7
    for job in jobs:
        result = run_in_process("validate", "-c", job, cwd=str(tmp_path))
        assert result.returncode == 0, (job, result.stderr)
    assert os.listdir(tmp_path / "runs") == ["digits"]  # validate wrote nothing


def checkpoint_values(ckpt_dir) -> dict:
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(ckpt_dir)))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


@pytest.mark.e2e
def test_warm_start_takes_included_variables_under_their_new_names(tmp_path):
    # A checkpoint whose variables are named legacy/... instead of mlp/...
    ok(run_in_process("train", *MLP, "--set", f"train.checkpoint_dir={tmp_path / 'a'}"))
    trained = {n: v for n, v in checkpoint_values(tmp_path / "a").items() if n.startswith("mlp/")}
    graph = tf.Graph()
    with graph.as_default():
        renamed = {n.replace("mlp/", "legacy/", 1): tf.compat.v1.get_variable(
            n.replace("mlp/", "legacy/", 1), initializer=v) for n, v in trained.items()}
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            tf.compat.v1.train.Saver(renamed).save(sess, str(tmp_path / "legacy" / "model"))

    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"train": {"warm_start": {
        "path": str(tmp_path / "legacy"), "exclude": ["logits"],
        "rename": {"legacy/": "mlp/"}}}}))
    # One step at a negligible rate: the values are what warm start put there.
    result = run_in_process("train", "-c", str(job), *MLP, "--set", "train.steps=1",
                        "--set", "optimizer.name=sgd", "--set", "optimizer.learning_rate=1e-12",
                        "--set", f"train.checkpoint_dir={tmp_path / 'b'}")
    ok(result)
    assert "warm start: 2 variable(s)" in result.stderr
    started = checkpoint_values(tmp_path / "b")
    np.testing.assert_allclose(started["mlp/hidden0/kernel"], trained["mlp/hidden0/kernel"],
                               atol=1e-9)
    assert not np.allclose(started["mlp/logits/kernel"], trained["mlp/logits/kernel"])
