"""Jobs without ps tasks: real workers on 127.0.0.1 all-reducing with TensorFlow's
collective ops, against one process on the whole batch, and their ends.

Every process a test starts is stopped by pid in a finally block; every wait is bounded.
"""

import re
import shutil
import signal

import numpy as np
import pytest
import tensorflow as tf
from helpers.checkpoints import checkpoint_variables
from helpers.commands import Cluster, last_json, ok, run_in_process, saved_steps, wait_until

pytestmark = pytest.mark.e2e

MLP = ["--set", "model.name=mlp", "--set", "model.hidden_units=[32]",
       "--set", "optimizer.name=momentum", "--set", "optimizer.learning_rate=0.05",
       "--set", "data.num_examples=512", "--set", "data.shuffle_buffer=0",
       "--set", "train.log_every_steps=1", "--set", "cluster.startup_timeout_secs=90"]


def assert_same_variables(expected_ckpt, got_ckpt, before: dict) -> None:
    expected = checkpoint_variables(expected_ckpt, "mlp/")
    got = checkpoint_variables(got_ckpt, "mlp/")
    assert expected.keys() == got.keys() and expected
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, atol=1e-5, rtol=0, err_msg=name)
    assert any(not np.allclose(before[n], expected[n]) for n in expected), "nothing trained"


def in_process(ckpt, *args: str) -> dict:
    return ok(run_in_process("train", *MLP, "--set", f"train.checkpoint_dir={ckpt}", *args))


def collective_job(tmp_path, name, ckpt, workers: int, *args: str) -> dict:
    """A job of `workers` workers and no ps tasks, run to its end; the chief's result."""
    run_dir = tmp_path / name
    run_dir.mkdir()
    cluster = Cluster(run_dir, [*MLP, *args], workers=workers, ps=0, ckpt=ckpt)
    try:
        for index in range(workers):
            cluster.start(f"worker{index}", "worker", index)
        cluster.finish(timeout=180)
        return {name: task.stdout for name, task in cluster.tasks.items()}
    finally:
        cluster.stop()


def test_two_then_three_workers_match_one_process_and_resume_across_modes(tmp_path):
    """2 workers of 1 tower for 3 steps, resumed from a checkpoint one process wrote, equal
    one process of 2 towers; then one process of 6 towers and 3 workers of 2 towers each,
    both resumed from the collective job's checkpoint, take a step on an uneven split
    (22, 21, 21 examples; the workers as 2 micro-batches each, gradients packed in
    buffers of 1 KiB) and agree again. Workers
    1 and 2 never restore: unless the chief's variables reach them by the broadcast,
    the runs part ways."""
    start = tmp_path / "start"
    in_process(start, "--set", "train.steps=1", "--set", "towers.devices=1",
               "--set", "train.batch_size=64")
    initial = checkpoint_variables(start, "mlp/")
    single, collective = tmp_path / "single", tmp_path / "collective"
    shutil.copytree(start, single)
    shutil.copytree(start, collective)

    in_process(single, "--set", "train.steps=4", "--set", "towers.devices=2",
               "--set", "train.batch_size=64")
    outputs = collective_job(tmp_path, "two", collective, 2, "--set", "train.steps=4",
                             "--set", "towers.devices=1", "--set", "train.batch_size=64")
    assert '"workers": 2' in outputs["worker1"] and '"global_step": 4' in outputs["worker1"]
    assert tf.train.latest_checkpoint(str(collective)).endswith("model.ckpt-4")
    assert_same_variables(single, collective, initial)

    # Then on 512 rows in a shuffled order, 2 passes (data.epochs): other data than the
    # checkpoint's, so both count its first pass as done and end with the next, at step
    # 4 + 512 / 64 = 12, having trained the same examples at every step.
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "rows.npz", features=rng.normal(size=(512, 784)).astype(np.float32),
             labels=rng.integers(0, 10, size=512))
    rows = ["--set", "data.source=npz", "--set", f"data.path={tmp_path / 'rows.npz'}",
            "--set", "data.shuffle_buffer=512", "--set", "data.epochs=2",
            "--set", "train.steps=100", "--set", "train.batch_size=64"]
    at_four = checkpoint_variables(collective, "mlp/")
    single_again = tmp_path / "single_again"
    shutil.copytree(collective, single_again)  # one process resumes what the workers wrote
    assert in_process(single_again, *rows, "--set", "towers.devices=6")["global_step"] == 12
    outputs = collective_job(tmp_path, "three", collective, 3, *rows,
                             "--set", "towers.devices=2", "--set", "train.accumulate_steps=2",
                             "--set", "towers.pack_gradients_bytes=1024")
    assert all('"global_step": 12' in out and '"stopped_by": "end of data"' in out
               for out in outputs.values()), outputs
    assert_same_variables(single_again, collective, at_four)


STEP = re.compile(r"towers: step (\d+)/")


def test_a_lost_worker_ends_the_others_with_138_and_a_sigterm_ends_every_worker_with_0(tmp_path):
    """3 workers: worker 2 killed, the other two end with 138 naming it (at once when
    their connection to it breaks, else once a step has waited
    cluster.operation_timeout_secs). The job restarted with 2 workers resumes from
    the chief's checkpoint; SIGTERM to both ends each with 0 after the same step, the
    chief's final checkpoint saved at it."""
    ckpt = tmp_path / "ckpt"
    job = [*MLP, "--set", "train.steps=1000000", "--set", "train.batch_size=64",
           "--set", "towers.devices=1", "--set", "train.checkpoint_every_steps=20",
           "--set", "train.log_every_steps=10", "--set", "cluster.operation_timeout_secs=6"]
    (tmp_path / "first").mkdir()
    first = Cluster(tmp_path / "first", job, workers=3, ps=0, ckpt=ckpt)
    try:
        for index in range(3):
            first.start(f"worker{index}", "worker", index)
        first.tasks["worker0"].wait_for(r"saved checkpoint at step [1-9]\d*", timeout=150)
        first.kill("worker2")
        for index in (0, 1):
            task = first.tasks[f"worker{index}"]
            assert task.wait(timeout=90) == 138, task.stderr[-3000:]
            named = re.search(r"not answering: (.+?)\); a job without ps tasks", task.stderr)
            assert named, task.stderr[-2000:]
            # Worker 2 is named. A worker that learned of the loss through the other
            # survivor (the ring passes it on) may also find that one gone: it ended
            # with 138 as soon as it saw the loss itself.
            assert re.search(r"\bworker 2 at 127\.0\.0\.1:\d+", named[1]), named[0]
            assert f"worker {index} at" not in named[1], named[0]
    finally:
        first.stop()
    saved = max(saved_steps(first.tasks["worker0"].stderr))

    (tmp_path / "second").mkdir()
    second = Cluster(tmp_path / "second", job, workers=2, ps=0, ckpt=ckpt)
    try:
        for index in range(2):
            second.start(f"worker{index}", "worker", index)
        chief = second.tasks["worker0"]
        chief.wait_for(rf"resuming from .*model\.ckpt-{saved} at step {saved}")
        wait_until(lambda: all(STEP.search(t.stderr) for t in second.tasks.values()),
                   "both workers to step")
        for task in second.tasks.values():
            task.proc.send_signal(signal.SIGTERM)
        codes = {name: task.wait(timeout=90) for name, task in second.tasks.items()}
        assert codes == {"worker0": 0, "worker1": 0}, chief.stderr[-3000:]
        results = {name: last_json(task.stdout) for name, task in second.tasks.items()}
    finally:
        second.stop()
    final = results["worker0"]["global_step"]
    assert results["worker1"]["global_step"] == final > saved
    assert results["worker0"]["stopped_by"] == results["worker1"]["stopped_by"] == "signal"
    assert tf.train.latest_checkpoint(str(ckpt)).endswith(f"model.ckpt-{final}")
