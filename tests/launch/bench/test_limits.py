"""The bench's distance to the limit: FLOPs counted from the graph, 16-bit notes, the
variant axes and what they do to the rows."""

import pytest
import tensorflow as tf
from helpers.tower_training import momentum

import models
import towers
from launch import bench
from launch.bench.limits import number_type_notes, step_flops
from launch.bench.report import gradient_bytes


@pytest.mark.parametrize("precision", ["float32", "mixed_bfloat16"])
def test_step_flops_counts_the_matmuls_of_forward_and_backward(graph, precision):
    batch, width, hidden, classes = 32, 64, 128, 10
    model = models.build("mlp", {"input_dim": width, "hidden_units": [hidden],
                                 "num_classes": classes})
    x, y = tf.zeros([batch, width]), tf.zeros([batch], tf.int32)
    ops = towers.build_train_op(model.model_fn, x, y, momentum(), ["/cpu:0"],
                                precision=precision)
    # Forward and weight gradients of both layers, the second layer's input gradient;
    # the first layer needs none (the features are not trained).
    matmuls = 2 * batch * (2 * width * hidden + 3 * hidden * classes)
    counted = step_flops(graph, ops.train_op)
    assert matmuls <= counted <= 1.1 * matmuls  # plus the element-wise ops'


def test_number_type_notes_read_the_cpu_flags():
    assert number_type_notes(["float32", "bfloat16"], {"avx2", "avx512_bf16"}) == {
        "bfloat16": "native (avx512_bf16)"}
    notes = number_type_notes(["bfloat16", "float16"], {"avx2"})
    assert notes["bfloat16"].startswith("emulated: this CPU has none of avx512_bf16, amx_bf16")
    assert notes["float16"] == ("emulated: this CPU has none of avx512_fp16, amx_fp16, so "
                                "TensorFlow converts to float32 and back; its rows' ratios "
                                "carry no speed goal")


def test_variants_are_every_combination_base_first():
    variants = bench.parse_variants("float32,mixed_bfloat16", "1,4", "off,on", None)
    assert len(variants) == 8 and variants[0] == bench.Variant()
    assert variants[-1].label == "mixed_bfloat16, xla, accumulate 4"
    assert bench.Variant(gradient_dtype="float16").label == "float32, float16 gradients"


def test_sync_batch_norm_rows_stand_beside_local_ones_where_it_runs():
    from launch.bench.settings import Row
    from launch.bench.throughput import cannot_run

    local, sync = bench.parse_variants(None, None, None, None, "local,sync")
    assert (local.label, sync.label) == ("float32", "float32, sync batch norm")
    assert sync.job_values()["towers.batch_norm"] == "sync"
    assert cannot_run(Row("replicated", 2, sync), None) is None
    assert "not available in the ps_worker row" in cannot_run(Row("ps_worker", 2, sync), None)


def test_packing_rows_set_the_key_and_say_so_and_others_keep_the_jobs_setting():
    unpacked, packed = bench.parse_variants(None, None, None, None, None, "0,4194304")
    assert (unpacked.label, packed.label) == ("float32, unpacked", "float32, packed in 4194304 B")
    assert packed.job_values()["towers.pack_gradients_bytes"] == 4194304
    assert "towers.pack_gradients_bytes" not in bench.Variant().job_values()


def test_rows_of_one_mode_and_count_stand_side_by_side():
    settings = bench.Settings("mlp", {}, 16, (1, 2), ("replicated", "mirrored"), 1, 0, 1,
                              variants=bench.parse_variants("float32,mixed_float16", None,
                                                            None, None))
    rows = [(r.mode, r.devices, r.variant.precision) for r in bench.plan_rows(settings)]
    assert rows == [(m, n, p) for m, n in [("1 device", 1), ("replicated", 2), ("mirrored", 2)]
                    for p in ("float32", "mixed_float16")]


def test_sixteen_bit_gradients_halve_the_bytes_moved():
    for mode in ("parameter_server", "replicated", "ps_worker", "horovod"):
        assert gradient_bytes(mode, 4, 1000, "bfloat16") * 2 == gradient_bytes(mode, 4, 1000)


@pytest.mark.parametrize("axes, message", [
    (("float32,float8", None, None, None), "--precision: unknown value 'float8'"),
    ((None, "0", None, None), "--accumulate: expected positive integers"),
    ((None, "two", None, None), "--accumulate: expected positive integers"),
    ((None, None, "maybe", None), "--xla: unknown value 'maybe'; accepted: off, on"),
    ((None, None, None, "int8"), "--gradient-dtype: unknown value 'int8'"),
    ((None, None, None, None, None, "0,4MiB"), "--pack-bytes: expected byte counts"),
    ((None, None, None, None, None, "-1"), "--pack-bytes: expected byte counts"),
])
def test_bad_axes_are_one_line_errors(axes, message):
    with pytest.raises(bench.BenchError, match=message):
        bench.parse_variants(*axes)


def test_micro_batches_must_feed_every_device():
    settings = bench.Settings("mlp", {}, 6, (1, 2), ("replicated",), 1, 0, 1,
                              variants=bench.parse_variants(None, "4", None, None))
    with pytest.raises(bench.BenchError, match="cannot give each of 2 towers at least one "
                                                 "example of each of 4 micro-batches"):
        bench.check_settings(settings)
