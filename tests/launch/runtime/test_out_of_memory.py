"""Out of memory: one line naming the device, the tensor that did not fit, the batch per
tower and the settings that fix it; exit status 5; the latest checkpoint intact and named.

The real job asks for a tensor no machine can hold (512 TiB: more than a 47-bit address
space; its shape keeps what the job does hold, its labels and weights, a few hundred MB), so
TensorFlow refuses it whatever the host's memory and overcommit policy: no test really
exhausts a shared machine. TensorFlow's oneDNN CPU allocator (mklcpu) would first wait
10 s for memory to be freed (its best-fit pool's retry); TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1,
TensorFlow's own setting, sends large tensors to the system allocator, which refuses at
once with the same OOM error under the same allocator name, so what towers makes of it
is what the test checks either way."""

import pytest
import tensorflow as tf
from helpers.checkpoints import latest_step
from helpers.commands import run_towers

from launch.errors import EXIT_OUT_OF_MEMORY, OutOfMemory
from launch.runtime.out_of_memory import out_of_memory, tower_batch

# TensorFlow's message, as a training step that ran out raises it (shortened).
REFUSED = ("2 root error(s) found.\n  (0) RESOURCE_EXHAUSTED: OOM when allocating tensor with "
           "shape[50000000,256] and type float on /job:localhost/replica:0/task:0/device:CPU:0 "
           "by allocator mklcpu\n\t [[{{node tower_0/convnet/dropout/random_uniform}}]]\n\n"
           "Current usage from device: /job:localhost/replica:0/task:0/device:CPU:0\n")


def test_an_allocation_refused_is_one_line_naming_device_tensor_batch_and_fix():
    with pytest.raises(OutOfMemory) as raised, out_of_memory(
            "at 50000000 examples per tower (train.batch_size 100000000 over 2 tower(s))",
            "lower train.batch_size", lambda: "The latest checkpoint is runs/x/model.ckpt-0"):
        raise tf.errors.ResourceExhaustedError(None, None, REFUSED)
    assert str(raised.value) == (
        "out of memory on CPU:0 (a float tensor of shape [50000000, 256], 47.7 GiB, did not "
        "fit) at 50000000 examples per tower (train.batch_size 100000000 over 2 tower(s)); "
        "lower train.batch_size. The latest checkpoint is runs/x/model.ckpt-0")
    assert raised.value.exit_status == EXIT_OUT_OF_MEMORY == 5


def test_other_exhausted_resources_are_not_called_memory():
    with pytest.raises(tf.errors.ResourceExhaustedError), out_of_memory("", ""):
        raise tf.errors.ResourceExhaustedError(None, None, "queue is full")


def test_the_batch_per_tower_is_the_largest_shard_of_a_micro_batch():
    assert tower_batch(100, 2) == 50 and tower_batch(101, 2) == 51
    assert tower_batch(64, 2, micro_batches=4) == 8


@pytest.mark.e2e
def test_a_batch_no_device_holds_ends_with_one_line_and_status_5(tmp_path, monkeypatch):
    monkeypatch.setenv("TF_ONEDNN_USE_SYSTEM_ALLOCATOR", "1")  # no 10 s retry (see above)
    run = run_towers(
        "train", "--set", "model.name=mlp", "--set", "model.input_dim=8388608",
        "--set", "model.hidden_units=[1]", "--set", "model.num_classes=2",
        "--set", "data.source=synthetic", "--set", "train.batch_size=16777216",
        "--set", f"train.checkpoint_dir={tmp_path}")
    assert run.returncode == EXIT_OUT_OF_MEMORY, run.stderr[-3000:]
    assert "Traceback" not in run.stderr and "RESOURCE_EXHAUSTED" not in run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("towers: error: out of memory on CPU:0 (a float tensor of shape "
                           "[16777216, 8388608], 524,288.0 GiB, did not fit) at 8388608 "
                           "examples per tower (train.batch_size 16777216 over 2 tower(s)); "
                           "lower train.batch_size, or raise train.accumulate_steps (now 1)"), last
    assert last.endswith(f"The latest checkpoint is {tmp_path}/model.ckpt-0")
    assert latest_step(tmp_path) == 0  # nothing lost: the step-0 checkpoint stands
