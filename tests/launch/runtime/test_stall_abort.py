"""train.stall_abort_secs ends a real `towers train` process whose step has stopped
moving: exit status 138 (retryable) and one line saying what the step waits for. The
model's compute waits on a queue that nothing fills, as a device that has stopped
answering would: its batch has arrived, so the step waits for its devices."""

import signal
import time

import pytest
from helpers.checkpoints import assert_nothing_lost
from helpers.commands import Process

from launch.errors import EXIT_PEER_UNAVAILABLE

MODEL = '''
import tensorflow as tf

def model(features, labels, ctx):
    weight = tf.compat.v1.get_variable("weight", [], initializer=tf.zeros_initializer())
    never = tf.queue.FIFOQueue(1, tf.float32).dequeue()  # nothing ever fills it
    return weight * tf.reduce_mean(features) + never

model.input_spec = {"feature_shape": (4,), "num_classes": 2}
'''


@pytest.mark.e2e
def test_a_stuck_step_ends_the_process_with_138_and_one_line(tmp_path):
    (tmp_path / "stuck_model.py").write_text(MODEL)
    task = Process(tmp_path, "train", "train", "--set", "model.name=stuck_model:model",
                   "--set", f"model.path={tmp_path}", "--set", "data.source=synthetic",
                   "--set", "train.stall_warning_secs=1",
                   "--set", "train.stall_abort_secs=2",
                   "--set", f"train.checkpoint_dir={tmp_path / 'ckpt'}")
    try:
        task.wait_for(r"towers: model ")
        started = time.monotonic()
        status = task.wait(timeout=120)
    finally:
        task.stop()
    lines = task.stderr.splitlines()
    print(*lines[-2:], f"(exit {status}, {time.monotonic() - started:.1f} s after start-up)",
          sep="\n")
    assert status == EXIT_PEER_UNAVAILABLE == 138
    errors = [line for line in lines if line.startswith("towers: error: ")]
    assert errors == [
        "towers: error: train.stall_abort_secs: no step finished for 2 s; the step has its "
        "batch and no peers to wait for: it waits for its devices (the towers' compute, or a "
        "device that does not answer). Restart the job: training resumes from the last "
        "checkpoint"]
    warning = next(line for line in lines if "no step has finished" in line)
    assert warning.endswith("(train.stall_warning_secs: 1): the step has its batch and no "
                            "peers to wait for: it waits for its devices (the towers' compute, "
                            "or a device that does not answer)")


@pytest.mark.e2e
def test_a_stop_signal_ends_a_process_whose_step_cannot_finish_within_its_bound(tmp_path):
    """SIGTERM while the step can never finish: it used to announce nothing and never
    end (the handler waits for the step, C++ that nothing interrupts), until an
    orchestrator's SIGKILL. Now the stop is acknowledged at once and ends the process
    train.stop_timeout_secs later, 138, the checkpoint of step 0 still the latest."""
    (tmp_path / "stuck_model.py").write_text(MODEL)
    ckpt = tmp_path / "ckpt"
    task = Process(tmp_path, "train", "train", "--set", "model.name=stuck_model:model",
                   "--set", f"model.path={tmp_path}", "--set", "data.source=synthetic",
                   "--set", "train.stop_timeout_secs=3",
                   "--set", f"train.checkpoint_dir={ckpt}")
    try:
        task.wait_for(r"saved checkpoint at step 0")
        task.proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        task.wait_for(r"received SIGTERM: saving a checkpoint and stopping", timeout=2.5)
        status = task.wait(timeout=60)
        took = time.monotonic() - sent
    finally:
        task.stop()
    print(task.stderr.splitlines()[-1], f"(exit {status}, {took:.1f} s after SIGTERM)")
    assert status == EXIT_PEER_UNAVAILABLE, task.stderr[-3000:]
    assert 3 <= took < 30, took
    errors = [line for line in task.stderr.splitlines() if line.startswith("towers: error: ")]
    assert errors == [
        "towers: error: received SIGTERM 3 s ago (train.stop_timeout_secs) and the step under "
        "way has not finished: the step has its batch and no peers to wait for: it waits for "
        "its devices (the towers' compute, or a device that does not answer); ending without "
        f"a final checkpoint: a restart resumes from the latest, {ckpt}/model.ckpt-0"], errors
    assert assert_nothing_lost(ckpt, 0) == 0
