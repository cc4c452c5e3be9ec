"""`towers bench` on a tiny model: it runs every mode, and its outputs parse.

The figures themselves are never asserted: they depend on the machine and its load.
"""

import csv
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
from typing import NamedTuple

import pytest
from helpers.commands import environment, run_in_process, towers_command

from launch.bench import MODES
from launch.bench.settings import FLOAT32, Row

# A 8-16-2 MLP: 8*16 + 16 + 16*2 + 2 = 178 float32 trainable values.
TINY = ["--set", "model.name=mlp", "--set", "model.input_dim=8",
        "--set", "model.hidden_units=[16]", "--set", "model.num_classes=2"]
TRAINABLE_BYTES = 178 * 4
SHORT = ["--batch", "16", "--steps", "3", "--warmup", "1"]

# What TensorFlow prints to stderr while it loads (oneDNN, CPU features, absl),
# which `towers` keeps out of its output.
STARTUP_NOTICES = ("oneDNN custom operations", "TF_ENABLE_ONEDNN_OPTS", "cpu_feature_guard",
                   "rebuild TensorFlow with the appropriate compiler flags",
                   "All log messages before absl::InitializeLog()")


def startup_notices(output: str) -> list[str]:
    return [line for line in output.splitlines()
            if any(notice in line for notice in STARTUP_NOTICES)]


def loud_environment() -> dict:
    """TensorFlow asked for every log line, as a user's environment may ask: then its
    start-up notices are printed however the process is started."""
    return {**environment(), "TF_CPP_MIN_LOG_LEVEL": "0"}


class EveryMode(NamedTuple):
    result: subprocess.CompletedProcess  # the bench's
    out: pathlib.Path  # its --out
    horovod: bool  # whether Horovod is installed here
    control: str  # what a bare TensorFlow import prints to stderr here


def start_probe() -> subprocess.Popen:
    """A fresh process importing TensorFlow and Horovod in the environment the bench runs
    in: whether Horovod is installed here, and the start-up notices TensorFlow prints
    when it loads (probe_result). It runs beside the bench's own start."""
    return subprocess.Popen(
        [sys.executable, "-c", "import tensorflow\nimport horovod.tensorflow"],
        env=loud_environment(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        stdin=subprocess.DEVNULL)


def probe_result(probe: subprocess.Popen) -> tuple[bool, str]:
    _, stderr = probe.communicate(timeout=120)
    return shutil.which("horovodrun") is not None and probe.returncode == 0, stderr


@pytest.fixture(scope="module")
def every_mode(tmp_path_factory) -> EveryMode:
    """Every mode at 1 and 2 devices in one run, the horovod row's real ranks included
    where Horovod is installed (without it the row says why it is skipped)."""
    out = tmp_path_factory.mktemp("bench")
    probe = start_probe()
    try:
        result = subprocess.run(
            towers_command("bench", *TINY, *SHORT, "--towers", "1,2", "--repeats", "2",
                           "--runs", "1", "--out", str(out), "--profile", str(out / "profile")),
            env=loud_environment(), capture_output=True, text=True, timeout=600,
            stdin=subprocess.DEVNULL)
    finally:
        horovod, control = probe_result(probe)
    assert result.returncode == 0, result.stderr[-3000:]
    return EveryMode(result, out, horovod, control)


@pytest.mark.e2e
def test_every_mode_measures_a_rate_or_says_why_not(every_mode):
    result, horovod = every_mode.result, every_mode.horovod
    lines = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    assert lines[0].startswith("| mode | devices | variant | examples/sec median |")
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    assert [(c[0], int(c[1]), c[2]) for c in cells] == [("1 device", 1, "float32")] + [
        (m, 2, "float32") for m in MODES]
    measured = cells if horovod else cells[:-1]
    for row in measured:
        assert float(row[3]) > 0, row  # a rate was measured
    if not horovod:
        assert cells[-1][3].startswith("skipped: "), cells[-1]


def test_without_horovodrun_the_horovod_row_is_skipped_and_says_why(monkeypatch):
    """What the bench does for the horovod row where horovodrun is not on PATH, as
    without Horovod installed (the rows run where it is: every_mode)."""
    from launch.bench.report import markdown_table
    from launch.bench.runs import horovod_missing
    from launch.bench.throughput import cannot_run

    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    row = Row("horovod", 2, FLOAT32)
    row.skipped = cannot_run(row, horovod_missing())
    table = markdown_table([row]).splitlines()
    assert table[-1].startswith("| horovod | 2 | float32 | skipped: horovodrun is not on PATH "
                                "(install Horovod: make horovod) |"), table


@pytest.mark.e2e
def test_profile_writes_a_trace_of_each_in_process_row_where_tensorboard_finds_it(every_mode):
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    result, out = every_mode.result, every_mode.out
    traces = dict(re.findall(r"towers: profile of 5 steps of (.+?) on \d device\(s\) "
                             r"\(float32\): (\S+)", result.stderr))
    assert set(traces) == {"1 device", "parameter_server", "replicated", "mirrored"}
    for row, path in traces.items():
        assert re.fullmatch(rf"{out}/profile/{row.replace(' ', '_')}-\d/plugins/profile/"
                            r"[^/]+/[^/]+\.xplane\.pb", path)
    space = xplane_pb2.XSpace.FromString(open(traces["parameter_server"], "rb").read())
    ops = [m.name for plane in space.planes for m in plane.event_metadata.values()]
    assert any("tower_1/" in name for name in ops)  # the second tower's ops were traced
    assert "towers: --profile: ps_worker on 2 devices is whole towers runs: profile one " \
        "with --set train.profile_steps=[first,last]" in result.stderr
    assert f"towers: profiles: tensorboard --logdir {out / 'profile'} " in result.stderr


@pytest.mark.e2e
def test_tensorflow_startup_notices_stay_out_of_the_output(every_mode):
    """The in-process rows' processes and the multi-process rows all load TensorFlow."""
    if not startup_notices(every_mode.control):
        pytest.skip("TensorFlow prints no start-up notices on this machine")
    assert startup_notices(every_mode.result.stdout + every_mode.result.stderr) == []


@pytest.mark.e2e
def test_json_rows_have_blocks_ratios_and_gradient_bytes(every_mode):
    out, horovod = every_mode.out, every_mode.horovod
    report = json.loads((out / "bench.json").read_text())
    rows = {(r["mode"], r["devices"]): r for r in report["rows"]}
    assert report["run"]["model"] == "mlp" and report["run"]["global_batch"] == 16
    assert report["run"]["trainable_bytes"] == TRAINABLE_BYTES
    assert rows[("1 device", 1)]["ratio_to_1_device"] == 1.0
    assert rows[("mirrored", 2)]["ratio_to_mirrored"] == 1.0
    for mode in ("parameter_server", "replicated", "mirrored"):
        assert rows[(mode, 2)]["blocks"] == 2  # --repeats
    assert rows[("ps_worker", 2)]["blocks"] == 1  # --runs
    for key, row in rows.items():
        if key[0] == "horovod" and not horovod:
            assert row["skipped"] and row["examples_per_sec_median"] is None
            continue
        assert row["skipped"] is None
        assert row["examples_per_sec_min"] <= row["examples_per_sec_median"]
        assert row["examples_per_sec_median"] <= row["examples_per_sec_max"]
        assert row["peak_rss_bytes"] > 0
    gradient = {key: row["gradient_bytes_per_step"] for key, row in rows.items()}
    # Sent to the parameters (N * G), or an all-reduce (2 (N - 1) * G), with N = 2.
    assert gradient[("1 device", 1)] == 0
    assert gradient[("parameter_server", 2)] == gradient[("ps_worker", 2)] == 2 * TRAINABLE_BYTES
    assert gradient[("replicated", 2)] == gradient[("mirrored", 2)] == 2 * TRAINABLE_BYTES
    if horovod:
        assert gradient[("horovod", 2)] == 2 * TRAINABLE_BYTES
        assert rows[("horovod", 2)]["blocks"] == 1  # --runs
    blocks = {(b["mode"], b["devices"]): b["examples_per_sec"] for b in report["blocks"]}
    assert len(blocks[("replicated", 2)]) == 2


@pytest.mark.e2e
def test_csv_matches_the_json(every_mode):
    out = every_mode.out
    with open(out / "bench.csv", newline="") as f:
        table = list(csv.DictReader(f))
    report = json.loads((out / "bench.json").read_text())
    for written, row in zip(table, report["rows"], strict=True):
        assert (written["mode"], int(written["devices"])) == (row["mode"], row["devices"])
        if row["examples_per_sec_median"] is not None:
            assert float(written["examples_per_sec_median"]) == pytest.approx(
                row["examples_per_sec_median"])


@pytest.mark.e2e
def test_plot_is_a_png_image(every_mode):
    out = every_mode.out
    from matplotlib import image

    pixels = image.imread(out / "bench.png")
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100


@pytest.mark.e2e
def test_memory_report_shows_one_set_of_variables_for_8_towers(tmp_path):
    # The command in this process (its rows are processes of their own either way).
    # The long run on 1 device (--towers): the rows of 1 and 8 towers are the point.
    result = run_in_process("bench", *TINY, "--memory", "10", *SHORT, "--accumulate", "2",
                            "--towers", "1", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| towers | peak RSS MiB |" in result.stdout
    assert "| accumulate_steps | micro-batch | peak RSS MiB |" in result.stdout
    report = json.loads((tmp_path / "memory.json").read_text())
    # The comparison itself is for a model large enough to matter (BENCHMARKS.md).
    assert [(r["accumulate_steps"], r["micro_batch"]) for r in report["accumulating"]] == [
        (1, 16), (2, 8)]
    assert all(r["peak_rss_bytes"] > 0 for r in report["accumulating"])
    one, eight = (next(r for r in report["towers"] if r["towers"] == n) for n in (1, 8))
    # parameter_server mode: the variables exist once, however many towers read them.
    assert eight["variables"] == one["variables"]
    assert eight["variable_bytes"] == one["variable_bytes"]
    assert one["peak_rss_bytes"] > 0 and eight["peak_rss_bytes"] > 0
    steps = [s["step"] for s in report["train_rss"]]
    assert steps and steps[-1] == 10 and steps == sorted(steps)


@pytest.mark.parametrize("args, message", [
    (["--modes", "parameter_server,sideways"], "--modes: unknown mode 'sideways'"),
    (["--towers", "0,2"], "--towers: device counts must be at least 1"),
    (["--towers", "two"], "--towers: expected device counts"),
    (["--batch", "2", "--towers", "1,4"],
     "--batch: a global batch of 2 examples cannot give each of 4 towers at least one example"),
    (["--steps", "0"], "--steps must be at least 1"),
    (["--model", "resnet21"], "--model: unknown model 'resnet21'"),
    (["--memory", "10", "--batch", "4"],
     "--memory: a global batch of 4 examples cannot give each of 8 towers"),
])
def test_bad_options_exit_2_with_one_line(args, message):
    result = run_in_process("bench", *TINY, *args)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("towers: error:")]
    assert len(errors) == 1 and message in errors[0], result.stderr[-2000:]


# The mirrored row's builder from launch.bench in a fresh interpreter: TF2 code, which
# needs eager mode and its logical devices set before TensorFlow starts (the towers
# rows build graphs: in the test's own process).
MIRRORED_STEPS = """
import sys, numpy as np
from helpers.small_resnet import resnet8
from launch import bench
initial, final = sys.argv[1], sys.argv[2]
case = bench.build_mirrored_case(resnet8(), 16, 2)
case.write(dict(np.load(initial)))
case.run(3)
np.savez(final, **case.read())
"""
TESTS = pathlib.Path(__file__).parents[2]  # where `helpers` is imported from


@pytest.mark.e2e
def test_mirrored_row_trains_the_same_model_maths_as_the_towers(tmp_path):
    """Same start, same batch, 3 steps: MirroredStrategy over 2 devices and 2 towers
    agree on every trainable variable (batch norm, weight decay and momentum included)."""
    import numpy as np
    from helpers.small_resnet import resnet8

    from launch import bench
    from launch.log import use_graph_mode

    use_graph_mode()  # as each towers row's process takes it
    case = bench.build_towers_case(resnet8(), 16, "parameter_server", 2)
    initial = case.read()
    np.savez(tmp_path / "initial.npz", **initial)
    case.run(3)
    towers = case.read()
    env = environment()
    env["PYTHONPATH"] = f"{TESTS}{os.pathsep}{env['PYTHONPATH']}"  # for helpers.small_resnet
    done = subprocess.run(
        [sys.executable, "-c", MIRRORED_STEPS, str(tmp_path / "initial.npz"),
         str(tmp_path / "mirrored.npz")],
        env=env, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    mirrored = dict(np.load(tmp_path / "mirrored.npz"))
    assert sorted(mirrored) == sorted(towers) and len(towers) > 20
    # Moved at all: a batch norm's gamma can move by less than allclose's 1e-5 in 3 steps
    # (0.999994 on one run's batches).
    changed = [name for name in towers if np.any(towers[name] != initial[name])]
    assert len(changed) == len(towers), set(towers) - set(changed)  # the steps trained
    for name, value in towers.items():
        np.testing.assert_allclose(mirrored[name], value, rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("prefix", ["[{rank}]<stdout>:", "[1,{rank}]<stdout>:"])
def test_horovod_rate_is_rank_0s_last_result(prefix):
    """horovodrun prefixes each rank's lines (Gloo `[0]`, MPI `[1,0]`); rank 0 reports
    the whole job, so other ranks' results and rank 0's earlier lines are ignored."""
    from launch.bench import cluster_rate

    lines = [(1, '{"job_examples_per_sec": 5.0}'), (0, "towers: step 20/40"),
             (0, '{"job_examples_per_sec": 7.0}'), (1, '{"job_examples_per_sec": 6.0}')]
    stdout = "\n".join(prefix.format(rank=rank) + text for rank, text in lines)
    assert cluster_rate("horovod", stdout, "") == 7.0


@pytest.mark.e2e
def test_precision_rows_side_by_side_with_flops_and_the_share_of_peak(tmp_path):
    # The command in this process (its rows are processes of their own either way).
    result = run_in_process("bench", *TINY, *SHORT, "--towers", "1", "--repeats", "2",
                            "--precision", "float32,mixed_bfloat16", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "bench.json").read_text())
    rows = {(r["mode"], r["devices"], r["variant"]): r for r in report["rows"]}
    assert list(rows) == [("1 device", 1, "float32"), ("1 device", 1, "mixed_bfloat16")]
    peaks = report["run"]["peak_flops"]
    assert set(peaks) == {"float32", "bfloat16"} and min(peaks.values()) > 1e8
    assert "bfloat16" in report["run"]["number_types"]
    for (mode, devices, variant), row in rows.items():
        base = rows[(mode, devices, "float32")]
        assert row["ratio_to_base_variant"] == pytest.approx(
            row["examples_per_sec_median"] / base["examples_per_sec_median"])
        # The same model maths in either precision: the same FLOPs per example.
        assert row["flops_per_example"] == base["flops_per_example"] > 0
        number_type = "float32" if variant == "float32" else "bfloat16"
        assert row["fraction_of_peak"] == pytest.approx(
            row["examples_per_sec_median"] * row["flops_per_example"] / peaks[number_type])
    # The ceiling: the model's own matmuls timed alone in both types, beside the row's
    # own gain over float32.
    half = rows[("1 device", 1, "mixed_bfloat16")]
    assert rows[("1 device", 1, "float32")]["kernel_ceiling"] is None
    assert half["kernel_ceiling"] > 0
    assert half["fraction_of_ceiling"] == pytest.approx(
        half["ratio_to_base_variant"] / half["kernel_ceiling"])
    assert "peak (2048x2048 matmul, median): float32" in result.stdout
    assert "| of peak | kernel ceiling | of ceiling |" in result.stdout
    assert 0 < report["run"]["kernel_share"] < 1.5

USER_MODEL = '''
import keras


def build(hidden=4):
    net = keras.Sequential([keras.layers.Dense(hidden, activation="relu"), keras.layers.Dense(2)])
    net.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return net


build.input_spec = {"feature_shape": [8], "num_classes": 2}
'''


def test_a_case_process_resolves_a_model_of_the_users_own(tmp_path):
    """What each in-process row's process does first, with a model found in model.path."""
    from launch.bench.case_process import build_case

    (tmp_path / "bench_user_net.py").write_text(USER_MODEL)
    spec = {"model": "bench_user_net:build", "params": {"hidden": 16}, "model_path": str(tmp_path),
            "job_dir": None, "batch": 8, "mode": "replicated", "devices": 2, "warmup": 1,
            "variant": tuple(FLOAT32)}
    case = build_case(spec)
    case.run(1)
    assert case.facts["trainable_bytes"] == (8 * 16 + 16 + 16 * 2 + 2) * 4  # one set, no copies
    assert sorted(case.read()) == ["sequential/dense/bias", "sequential/dense/kernel",
                                   "sequential/dense_1_1/bias", "sequential/dense_1_1/kernel"]


# A model whose rows stop answering, as rows did on a machine too loaded for them: the
# 1-device row hangs in its build, the first 2-tower row to build in its first timed
# step (after the warm-up). `marks` is a directory where each claims its part.
STALLING_MODEL = '''
import os
import time

import numpy as np
import tensorflow as tf

import towers


def _claim(marks, part):
    try:
        os.close(os.open(os.path.join(marks, part), os.O_CREAT | os.O_EXCL))
        return True
    except FileExistsError:
        return False


def build(marks, warmup):
    def model_fn(features, labels, ctx):
        w = tf.compat.v1.get_variable("w", [8, 2])
        logits = tf.matmul(features, w)
        if ctx.num_towers == 1 and _claim(marks, "build"):
            time.sleep(3600)
        if ctx.num_towers == 2 and ctx.index == 0 and _claim(marks, "step"):
            steps = []

            def stall():
                steps.append(1)
                if len(steps) > warmup:
                    time.sleep(3600)
                return np.float32(0)

            logits += tf.numpy_function(stall, [], tf.float32, stateful=True)
        losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        return towers.TowerOutputs(tf.reduce_mean(losses))

    return model_fn


build.input_spec = {"feature_shape": [8], "num_classes": 2}
'''


@pytest.mark.e2e
def test_rows_that_stop_answering_are_reported_and_the_others_measured(tmp_path, capfd):
    (tmp_path / "stalling_net.py").write_text(STALLING_MODEL)
    (tmp_path / "marks").mkdir()
    # The command in this process (its rows are processes of their own either way). It
    # waits out --timeout twice (the build, then the timed step): as short as lets the
    # rows that answer build on a slow, loaded machine (3 s here alone, 8 s under load).
    result = run_in_process(
        "bench", "--set", "model.name=stalling_net:build",
        "--set", f"model.path={tmp_path}", "--set", f"model.marks={tmp_path}/marks",
        "--set", "model.warmup=1", "--batch", "8", "--steps", "2", "--warmup", "1",
        "--repeats", "2", "--towers", "1,2",
        "--modes", "parameter_server,replicated", "--timeout", "20")
    rows_output = capfd.readouterr().err  # what the rows' processes wrote
    assert result.returncode == 1, result.stderr[-3000:]  # rows failed: the table says why
    assert "Traceback" not in result.stderr + rows_output
    rows = {line.split("|")[1].strip(): line.split("|")[4].strip()
            for line in result.stdout.splitlines() if line.startswith("| ") and "float32" in line}
    silent = "failed: did not answer within 20 s (--timeout)"
    assert rows["1 device"] == silent  # the baseline's build
    assert sorted(rows[mode] == silent for mode in ("parameter_server", "replicated")) == [
        False, True]  # one row's timed step
    measured = next(r for r in rows.values() if r != silent)
    assert float(measured) > 0
    assert sorted(p.name for p in (tmp_path / "marks").iterdir()) == ["build", "step"]
