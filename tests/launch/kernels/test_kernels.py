"""The kernels of a step: found in the graph, rebuilt alone, timed, combined, probed."""

import json
import os
import threading
from collections import Counter

import pytest
import tensorflow as tf
from helpers.tower_training import momentum

import models
import towers
from launch import kernels, tf_process
from launch.kernels import FORWARD, GRADIENT, Kernel, Probe
from launch.kernels.timing import MAX_REPEATS, build_alone, repeats

v1 = tf.compat.v1


def convnet_step(batch=4, precision="float32", devices=("/cpu:0",)):
    """A train op of a small convnet (2 convolutions, a dense layer) and its graph."""
    model = models.build("convnet", {"image_size": 8, "filters": [4, 8], "kernel_size": 3,
                                     "dense_units": 16, "num_classes": 3})
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [batch, 8, 8, 1])
        y = v1.placeholder(tf.int32, [batch])
        ops = towers.build_train_op(model.model_fn, x, y, momentum(), list(devices),
                                    precision=precision)
    return graph, ops.train_op


def test_a_steps_kernels_are_its_convolutions_and_products_forward_and_backward():
    _, train_op = convnet_step()
    found = kernels.kernels_of(kernels.ops_run_by(train_op))
    kinds = Counter((k.op, k.part) for k in found.elements())
    # The first convolution has no input gradient: the features are not trained.
    assert kinds == {("Conv2D", FORWARD): 2, ("Conv2DBackpropFilter", GRADIENT): 2,
                     ("Conv2DBackpropInput", GRADIENT): 1, ("MatMul", FORWARD): 2,
                     ("MatMul", GRADIENT): 4}
    first = next(k for k in found if k.op == "Conv2D" and k.operands[1][2] == 1)
    assert first.operands == ((4, 8, 8, 1), (3, 3, 1, 4)) and first.output == (4, 8, 8, 4)
    assert dict(first.attrs)["padding"] == "SAME"


def test_every_tower_runs_the_same_kernels_and_16_bits_change_none():
    one = kernels.kernels_of(kernels.ops_run_by(convnet_step(batch=4)[1]))
    two = kernels.kernels_of(kernels.ops_run_by(
        convnet_step(batch=8, devices=("/cpu:0", "/cpu:1"))[1]))
    assert two == Counter({k: 2 * n for k, n in one.items()})
    half = kernels.kernels_of(kernels.ops_run_by(
        convnet_step(precision="mixed_bfloat16")[1]))
    assert half == one


def test_an_unknown_batch_is_the_towers_batch():
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [None, 6])
        product = tf.matmul(x, tf.ones([6, 5]))
    found = kernels.kernels_of(graph.get_operations(), batch=32)
    assert list(found) == [Kernel("MatMul", ((32, 6), (6, 5)), (32, 5),
                                  (("transpose_a", False), ("transpose_b", False)), FORWARD)]
    assert not kernels.kernels_of([product.op])  # and without it, the kernel is left out


def test_each_kernel_rebuilt_alone_makes_what_the_step_made():
    # A kernel is rebuilt from its shapes and attributes: the output shapes agree.
    _, train_op = convnet_step()
    found = kernels.kernels_of(kernels.ops_run_by(train_op))
    for dtype in (tf.float32, tf.bfloat16):
        with tf.Graph().as_default():
            for kernel in found:
                made = build_alone(kernel, dtype)[0].outputs[0]
                assert (tuple(made.shape), made.dtype) == (kernel.output, dtype), kernel


def test_a_small_kernel_runs_several_times_a_run_so_the_run_costs_it_nothing():
    small = Kernel("MatMul", ((8, 16), (16, 4)), (8, 4), (), FORWARD)
    large = Kernel("MatMul", ((512, 2048), (2048, 2048)), (512, 2048), (), FORWARD)
    assert (small.flops, large.flops) == (2 * 8 * 16 * 4, 2 * 512 * 2048 * 2048)
    assert repeats(small) == MAX_REPEATS and repeats(large) == 1
    with tf.Graph().as_default():
        chain = build_alone(small, tf.float32, 3)
    # One after the other: each waits for the one before.
    assert [list(op.control_inputs) for op in chain] == [[], chain[:1], chain[1:2]]


def test_the_timer_times_every_kernel_in_every_type():
    _, train_op = convnet_step()
    found = kernels.kernels_of(kernels.ops_run_by(train_op))
    timer = kernels.KernelTimer(found, ["float32", "bfloat16"])
    try:
        assert timer.warm_up() and timer.time_block() and timer.time_block()
        timings = timer.timings()
    finally:
        timer.close()
    assert set(timings) == {k.key for k in found}
    assert all(set(t) == {"float32", "bfloat16"} and min(t.values()) > 0
               for t in timings.values())


def test_the_speedup_weighs_each_kernel_by_its_float32_time():
    a = Kernel("MatMul", ((2, 2), (2, 2)), (2, 2), (), FORWARD)
    b = Kernel("Conv2DBackpropFilter", ((1, 4, 4, 1), (1, 4, 4, 1)), (1, 1, 1, 1), (), GRADIENT)
    timings = {a.key: {"float32": 3.0, "bfloat16": 1.0}, b.key: {"float32": 1.0, "bfloat16": 2.0}}
    counts = {a: 1, b: 2}
    # float32 3 + 2 * 1 = 5 s; bfloat16 1 + 2 * 2 = 5 s: no gain over the whole step.
    assert kernels.speedup(counts, timings, "bfloat16") == 1.0
    assert kernels.speedup(counts, timings, "bfloat16", FORWARD) == 3.0
    assert kernels.speedup(counts, timings, "bfloat16", GRADIENT) == 0.5
    assert kernels.speedup(counts, timings, "float16") is None
    assert kernels.float32_seconds(counts, timings) == 5.0


def slow(overall, forward=0.69, gradient=0.005, timed=4, of=4):
    return Probe("float16", overall, forward, gradient, timed, of, "/cache/kernels.json")


def test_a_16_bit_job_whose_kernels_ran_slower_is_told_the_measured_ratios():
    note = kernels.precision_note("mixed_float16", slow(0.006))
    assert note.startswith("mixed_float16: on this machine the model's convolutions and "
                           "matrix products ran at 0.006x their float32 speed (forward 0.69x, "
                           "gradients 0.005x; timed alone at start-up)")
    assert "`towers bench --quick --towers 1 --precision float32,mixed_float16`" in note
    assert "2 of its 4 kernels timed" in kernels.precision_note("mixed_float16",
                                                                slow(0.5, timed=2))


@pytest.mark.parametrize("overall", [1.0, 1.7, None])
def test_a_16_bit_job_whose_kernels_are_not_slower_hears_nothing(overall):
    assert kernels.precision_note("mixed_bfloat16", slow(overall)) is None


def test_the_warning_is_for_16_bit_cpu_towers_only(tmp_path):
    _, train_op = convnet_step()
    for precision, devices in (("float32", ["/cpu:0"]), ("mixed_bfloat16", ["/gpu:0"]),
                               ("mixed_float16", ["/job:worker/task:1/device:GPU:0"])):
        assert kernels.startup_note(train_op, precision, devices, 4, str(tmp_path)) is None
    assert not list(tmp_path.iterdir())  # nothing was probed


def test_the_startup_note_reads_the_probe_from_the_machines_cache(tmp_path):
    # The probe's result handed to the start-up code through its cache: float16
    # kernels 100 times slower than float32, whatever this CPU does.
    _, train_op = convnet_step(precision="mixed_float16")
    found = kernels.kernels_of(kernels.ops_run_by(train_op))
    cache = kernels.cache_file(str(tmp_path))
    with open(cache, "w") as f:
        json.dump({k.key: {"float32": 0.001, "float16": 0.1} for k in found}, f)
    note = kernels.startup_note(train_op, "mixed_float16", ["/cpu:0"], 4, str(tmp_path))
    assert note.startswith("mixed_float16: on this machine the model's convolutions and "
                           "matrix products ran at 0.01x their float32 speed (forward 0.01x, "
                           "gradients 0.01x; timed alone at start-up)")


def test_the_real_probe_times_the_models_kernels_once_per_machine(tmp_path):
    _, train_op = convnet_step()
    found = kernels.kernels_of(kernels.ops_run_by(train_op))
    # Time enough for every kernel on a busy machine too: the time limit has its own
    # test (test_a_probe_out_of_time_says_how_much_it_timed).
    first = kernels.probe(found, "bfloat16", seconds=300.0, cache_dir=str(tmp_path))
    assert first.cache == kernels.cache_file(str(tmp_path))
    assert first.timed == first.kernels == len(found)
    for figure in (first.overall, first.forward, first.gradient):
        assert 0 < figure < 100
    written = json.loads(open(first.cache).read())
    assert set(written) == {k.key for k in found}
    # Asked again (another job on this machine), it times nothing: the same figures.
    assert kernels.probe(found, "bfloat16", cache_dir=str(tmp_path)) == first
    assert json.loads(open(first.cache).read()) == written


def test_timings_are_kept_apart_for_each_set_of_kernels_a_cpu_runs(tmp_path, monkeypatch):
    # One Xeon ran the default job's kernels in bfloat16 at 0.38x float32 with oneDNN and
    # at 0.094x without: timings taken under one must not answer a job under the other.
    for name in tf_process.ONEDNN_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    plain = kernels.cache_file(str(tmp_path))
    assert kernels.cache_file(str(tmp_path)) == plain
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    held_to_avx2 = kernels.cache_file(str(tmp_path))
    flipped = not tf_process._onednn_on()  # TensorFlow decides it once per process
    monkeypatch.setattr(tf_process, "_onednn_on", lambda: flipped)
    other_kernels = kernels.cache_file(str(tmp_path))
    made = [plain, held_to_avx2, other_kernels]
    assert len(set(made)) == 3 and {os.path.dirname(path) for path in made} == {str(tmp_path)}


def test_parallel_probes_take_turns_and_time_each_kernel_once(tmp_path):
    # Two small products: what is checked is the turn taking, not the timing, and a
    # step's kernels in bfloat16 cost seconds where this CPU has no bfloat16 units.
    found = Counter({Kernel("MatMul", ((8, 16), (16, 4)), (8, 4), (), FORWARD): 2,
                     Kernel("MatMul", ((8, 4), (4, 16)), (8, 16), (), GRADIENT): 1})
    results = []
    threads = [threading.Thread(target=lambda: results.append(
        kernels.probe(found, "bfloat16", cache_dir=str(tmp_path)))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Two processes of one job starting together (here threads, each with its own
    # handle on the lock): the second to take it finds the first's timings and times
    # nothing, so both say the same (timed twice, the figures would differ).
    assert len(results) == 2 and results[0] == results[1]


def test_a_probe_out_of_time_says_how_much_it_timed(tmp_path):
    _, train_op = convnet_step()
    found = kernels.kernels_of(kernels.ops_run_by(train_op))
    nothing = kernels.probe(found, "bfloat16", seconds=0.0, cache_dir=str(tmp_path))
    assert nothing.timed == 0 and nothing.overall is None
    assert kernels.precision_note("mixed_bfloat16", nothing) is None
