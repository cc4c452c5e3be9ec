"""Step phases: each step's wall time split into input wait, compute, exchange and apply,
from sampled step statistics, shown in the progress line, the result, the metrics and one
line of advice that follows the measured shares."""

import re

import pytest
import tensorflow as tf
from conftest import cpu_session_config
from helpers.tower_training import momentum, tiny_classifier
from prometheus_client import generate_latest
from tensorflow.core.framework.step_stats_pb2 import StepStats

import models
import towers
from launch import metrics
from launch.config import from_dict
from launch.devices import bfloat16_units
from launch.runtime.advice import Setup, advice, bfloat16_setup, bottleneck
from launch.runtime.step_phases import StepPhaseHook, StepPhases, op_intervals, split_step
from launch.runtime.train import train

V1 = tf.compat.v1
SHARES = re.compile(r"input (\d+)% compute (\d+)% exchange (\d+)% apply (\d+)%")
TINY_JOB = {"model": {"name": "mlp", "input_dim": 8, "hidden_units": [16], "num_classes": 2},
            "data": {"source": "synthetic", "num_examples": 256}, "towers": {"devices": 2}}


def stats(*nodes) -> StepStats:
    """nodes: (device, name, op type, start, end) in microseconds."""
    step = StepStats()
    devices = {}
    for device, name, op, start, end in nodes:
        if device not in devices:
            devices[device] = step.dev_stats.add(device=device)
        node = devices[device].node_stats.add(node_name=name, all_start_micros=start,
                                              all_end_rel_micros=end - start)
        node.timeline_label = f"{name} = {op}(a)"
    return step


def test_a_step_splits_by_what_runs_and_compute_wins_where_phases_overlap():
    step = stats(("cpu:0", "IteratorGetNext", "IteratorGetNext", 1000, 1030),
                 ("cpu:0", "tower_0/dense/MatMul", "MatMul", 1030, 1080),
                 ("cpu:1", "aggregate/AddN", "AddN", 1070, 1085),  # 10 under compute
                 ("cpu:0", "Momentum/update_w", "ApplyMomentum", 1090, 1100))
    shares = split_step(step, gaps_to="exchange")  # 1085..1090 runs nothing: a wait
    assert shares == pytest.approx({"input": 0.3, "compute": 0.5, "exchange": 0.1, "apply": 0.1})
    assert split_step(step)["compute"] == pytest.approx(0.55)  # one process: gaps are compute
    assert split_step(StepStats()) == {}


def test_steps_before_the_first_sample_are_charged_in_its_shares():
    seen = []
    phases = StepPhases(seen.append)
    phases.add(1.0)
    phases.add(1.0, {"input": 0.5, "compute": 0.5, "exchange": 0.0, "apply": 0.0})
    phases.add(2.0)
    assert phases.total == {"input": 2.0, "compute": 2.0, "exchange": 0.0, "apply": 0.0}
    assert sum(sum(s.values()) for s in seen) == pytest.approx(4.0)


def test_a_progress_lines_shares_are_its_intervals_samples_or_say_they_are_the_runs():
    phases = StepPhases()
    assert phases.window_text() == ""  # nothing measured yet
    phases.add(1.0, {"input": 0.5, "compute": 0.5, "exchange": 0.0, "apply": 0.0})
    phases.add(3.0)
    assert phases.window_text() == "input 50% compute 50% exchange 0% apply 0%"
    phases.add(1.0, {"input": 0.0, "compute": 1.0, "exchange": 0.0, "apply": 0.0})
    assert phases.window_text() == "input 0% compute 100% exchange 0% apply 0%"
    phases.add(5.0)  # no sample in this interval: the run's shares, and it says so
    assert phases.window_text() == "run so far: input 20% compute 80% exchange 0% apply 0%"


def test_a_short_runs_lines_never_repeat_one_sample_as_their_own(tmp_path):
    """One sample in the whole run (phase_sample_secs far longer than it): the first
    line, whose interval holds it, shows it; the others say they show the run's."""
    lines = []
    train(from_dict({**TINY_JOB, "train": {"batch_size": 32, "steps": 30, "log_every_steps": 10,
                                           "phase_sample_secs": 3600,
                                           "checkpoint_dir": str(tmp_path)}}),
          write=lines.append)
    shown = [line.split(" eta=")[1].partition(" ")[2] for line in lines
             if line.startswith("step ")]
    assert len(shown) == 3 and SHARES.fullmatch(shown[0]), shown
    assert all(text.startswith("run so far: ") and SHARES.search(text) for text in shown[1:])


@pytest.mark.parametrize("shares, expected, names", [
    ({"input": 0.31, "compute": 0.52, "exchange": 0.14, "apply": 0.03}, "input",
     ["data.num_parallel_calls (now 2)", "data.threads (now 1)", "TFRecords"]),
    ({"input": 0.02, "compute": 0.40, "exchange": 0.55, "apply": 0.03}, "exchange",
     ["towers.variable_update: replicated", "towers.gradient_dtype"]),
    ({"input": 0.10, "compute": 0.80, "exchange": 0.08, "apply": 0.02}, "compute",
     ["towers.precision", "towers.xla"]),
    ({"input": 0.00, "compute": 0.60, "exchange": 0.00, "apply": 0.40}, "apply",
     ["towers.param_device: least_loaded", "(sgd)"]),
])
def test_the_advice_names_the_measured_bottleneck_and_its_settings(shares, expected, names):
    job = from_dict({"data": {"source": "tfrecord", "path": "x", "schema": "imagenet",
                              "num_parallel_calls": 2, "threads": 1}})
    assert bottleneck(shares) == expected
    line = advice(shares, job)
    assert line.startswith(f"{expected}-bound ({round(100 * shares[expected])}% of the step")
    assert all(name in line for name in names), line


@pytest.mark.parametrize("shares, towers_section, in_use", [
    ({"input": 0.0, "compute": 0.9, "exchange": 0.05, "apply": 0.05},
     {"precision": "mixed_bfloat16"}, "towers.precision"),
    ({"input": 0.0, "compute": 0.4, "exchange": 0.55, "apply": 0.05},
     {"gradient_dtype": "bfloat16"}, "towers.gradient_dtype"),
    ({"input": 0.0, "compute": 0.6, "exchange": 0.0, "apply": 0.4},
     {"param_device": "least_loaded"}, "towers.param_device"),
])
def test_the_advice_never_proposes_the_setting_in_use(shares, towers_section, in_use):
    line = advice(shares, from_dict({"towers": towers_section}))
    assert in_use not in line and "try " in line, line


def test_with_everything_in_use_the_advice_says_what_is_left():
    line = advice({"input": 0.0, "compute": 0.9, "exchange": 0.05, "apply": 0.05},
                  from_dict({"towers": {"precision": "mixed_bfloat16", "xla": True}}))
    assert line.startswith("compute-bound (90% of the step is the towers' forward and backward"
                           "): 16-bit compute and XLA are in use already"), line
    assert "try" not in line


@pytest.mark.parametrize("flags, devices, named", [
    ({"avx2", "fma"}, ["/cpu:0", "/cpu:1"], None),
    ({"avx512f", "avx512_bf16"}, ["/cpu:0"], "this CPU has avx512_bf16"),
    ({"avx512_bf16", "amx_bf16"}, ["/cpu:0"], "this CPU has avx512_bf16 and amx_bf16"),
    ({"avx2"}, ["/gpu:0", "/gpu:1"], "GPUs"),
])
def test_bfloat16_is_advised_only_where_the_devices_compute_it(flags, devices, named):
    """On a CPU without avx512_bf16 or AMX TensorFlow emulates bfloat16 (0.07-0.13x
    float32): a compute-bound float32 run there is pointed at XLA alone."""
    units = bfloat16_units(devices, flags)
    assert units == named
    compute = {"input": 0.0, "compute": 0.95, "exchange": 0.03, "apply": 0.02}
    line = advice(compute, from_dict({}), Setup(bfloat16=units))
    assert ("mixed_bfloat16" in line) is (named is not None), line
    assert "towers.xla: true" in line, line
    if named:
        assert f"mixed_bfloat16 ({named})" in line, line
    done = advice(compute, from_dict({"towers": {"xla": True}}), Setup(bfloat16=units))
    assert ("try" in done) is (named is not None), done
    assert "16-bit compute and XLA are in use" not in done, done


@pytest.mark.parametrize("precision", ["float32", "mixed_bfloat16"])
def test_xla_is_not_proposed_for_towers_on_cpus(precision):
    """XLA's CPU code ran every built-in job measured at 0.38x to 0.76x (BENCHMARKS.md)."""
    compute = {"input": 0.0, "compute": 0.95, "exchange": 0.03, "apply": 0.02}
    job = from_dict({"towers": {"precision": precision}})
    on_gpus = advice(compute, job, Setup(bfloat16=None))
    assert "towers.xla: true" in on_gpus, on_gpus
    on_cpus = advice(compute, job, Setup(bfloat16=None, xla_may_pay=False))
    assert "towers.xla" not in on_cpus and "try" not in on_cpus, on_cpus
    assert "XLA is left out on CPU towers (it ran the built-in jobs at 0.38x" in on_cpus
    held_back = "16-bit compute is in use" if precision != "float32" else "no bfloat16"
    assert held_back in on_cpus, on_cpus
    offered = advice(compute, from_dict({}), Setup(xla_may_pay=False))
    assert offered.endswith("try towers.precision: mixed_bfloat16 (GPUs, CPUs with "
                            "avx512_bf16 or AMX)"), offered


@pytest.mark.parametrize("units", [None, "this CPU has amx_bf16"])
def test_a_measured_bfloat16_speed_decides_over_the_cpu_flags(units):
    compute = {"input": 0.0, "compute": 0.95, "exchange": 0.03, "apply": 0.02}
    for measured, offered in ((0.38, False), (1.6, True)):
        bfloat16, why_not = bfloat16_setup(units, measured)
        line = advice(compute, from_dict({}), Setup(bfloat16=bfloat16, no_bfloat16=why_not))
        assert ("mixed_bfloat16" in line) is offered, line
        done = advice(compute, from_dict({"towers": {"xla": True}}),
                      Setup(bfloat16=bfloat16, no_bfloat16=why_not))
        ran = f"ran the model's convolutions and matrix products at {measured:.2g}x their"
        assert ran in (line if offered else done), (line, done)
        assert ("try" in done) is offered, done
    assert bfloat16_setup(units, None)[0] == units  # never measured: the flags


@pytest.mark.parametrize("step_secs, short", [(0.0016, True), (0.05, False), (None, False)])
def test_a_step_of_a_few_milliseconds_is_pointed_at_the_batch_size_not_the_precision(
        step_secs, short):
    """A 4-16-3 mlp on batches of 32 steps in about 1.6 ms on a CPU: its 'compute' is
    the fixed cost of a step, which 16-bit compute or XLA would not shorten."""
    compute = {"input": 0.1, "compute": 0.8, "exchange": 0.05, "apply": 0.05}
    line = advice(compute, from_dict({"train": {"batch_size": 32}}), step_secs=step_secs)
    assert ("a larger train.batch_size (now 32)" in line) is short, line
    assert ("towers.precision" in line) is not short, line
    if short:
        assert "a step of 1.6 ms is mostly the fixed cost of a step" in line, line
    waiting = {"input": 0.8, "compute": 0.1, "exchange": 0.05, "apply": 0.05}
    assert "batch_size" not in advice(waiting, from_dict({}), step_secs=step_secs)


def test_the_mean_step_counts_the_steps_run_before_the_first_sample():
    phases = StepPhases()
    phases.add(0.004)  # before any sample: charged when the first one comes
    phases.add(0.002, {"input": 0.5, "compute": 0.5, "exchange": 0.0, "apply": 0.0})
    assert phases.step_secs() == pytest.approx(0.003)
    assert StepPhases().step_secs() is None


def test_an_exchange_bound_chief_that_named_a_straggler_is_pointed_at_it():
    shares = {"input": 0.0, "compute": 0.2, "exchange": 0.78, "apply": 0.02}
    line = advice(shares, from_dict({}), Setup(ps_tasks=True, processes=3),
                  ["worker 1 at h:2"])
    assert "worker 1 at h:2 was named a straggler above: speed it up first" in line
    assert "gradient_dtype" not in line and "try" not in line


def test_a_16_bit_job_is_not_told_to_try_its_own_precision(tmp_path):
    lines = []
    train(from_dict({**TINY_JOB, "towers": {"devices": 2, "precision": "mixed_bfloat16"},
                     "train": {"batch_size": 32, "steps": 20, "phase_sample_secs": 0,
                               "checkpoint_dir": str(tmp_path)}}), write=lines.append)
    said = [line for line in lines if line.startswith("advice: ")]
    assert len(said) == 1 and "mixed_bfloat16" not in said[0], said


def test_under_xla_the_compiled_towers_are_measured_as_compute(graph):
    # towers.xla: a step runs XLA's clusters ("cluster_3_1/xla_run") in place of the
    # towers' ops, named by TensorFlow, not by any scope of the towers.
    model = models.build("mlp", {"input_dim": 64, "hidden_units": [256], "num_classes": 4})
    ops = towers.build_train_op(model.model_fn, tf.random.uniform([64, 64]),
                                tf.zeros([64], tf.int32), momentum(), ["/cpu:0", "/cpu:1"],
                                xla=True)
    trace = V1.RunMetadata()
    with V1.Session(config=cpu_session_config(2)) as session:
        session.run(V1.global_variables_initializer())
        session.run(ops.train_op)  # compiles
        session.run(ops.train_op, run_metadata=trace,
                    options=V1.RunOptions(trace_level=V1.RunOptions.FULL_TRACE))
    compiled = {phase for _, _, phase, _, name in op_intervals(trace.step_stats)
                if name.endswith("/xla_run")}
    assert compiled == {"compute"}, compiled
    shares = split_step(trace.step_stats)
    assert shares["compute"] > shares["apply"], shares


def test_a_slow_input_pipeline_is_measured_as_input_wait():
    def slow(x, y):  # a few large matmuls per example: the pipeline, not the model, is slow
        m = tf.fill([300, 300], 0.001) + x[0]  # from the example: nothing to fold
        for _ in range(4):
            m = tf.matmul(m, m)
        return x + tf.reduce_sum(m) * 0.0, y

    with tf.Graph().as_default():
        dataset = tf.data.Dataset.from_tensors((tf.zeros([4]), tf.constant(0))).repeat()
        options = tf.data.Options()
        options.experimental_optimization.inject_prefetch = False  # no batch made ahead
        dataset = dataset.map(slow, num_parallel_calls=1).batch(8).with_options(options)
        features, labels = V1.data.make_one_shot_iterator(dataset).get_next()
        ops = towers.build_train_op(tiny_classifier, features, labels, momentum(), ["/cpu:0"])
        phases = StepPhases()
        with V1.train.MonitoredTrainingSession(hooks=[StepPhaseHook(phases, 0.0)]) as sess:
            for _ in range(6):
                sess.run(ops.train_op)
    shares = phases.shares()
    assert shares["input"] > 0.5 and bottleneck(shares) == "input", shares


def test_a_job_shows_its_phases_in_progress_lines_result_and_metrics(tmp_path):
    raw = {**TINY_JOB, "train": {"batch_size": 32, "steps": 30, "log_every_steps": 10,
                     "phase_sample_secs": 0, "checkpoint_dir": str(tmp_path)}}
    lines = []
    exporter = metrics.start(from_dict({"metrics": {"port": 0}}).metrics,
                             metrics.Identity("train", 0, "test"), lines.append)
    try:
        result = train(from_dict(raw), exporter=exporter, write=lines.append)
        text = generate_latest(exporter.registry).decode()
    finally:
        exporter.close(final_scrape=False)
    progress = [line for line in lines if line.startswith("step ")]
    assert len(progress) == 3 and all(SHARES.search(line) for line in progress)
    for line in progress:  # rounded shares of one window add up to about 100%
        assert abs(sum(map(int, SHARES.search(line).groups())) - 100) <= 2
    assert set(result["step_phases"]) == {"input", "compute", "exchange", "apply"}
    assert sum(result["step_phases"].values()) == pytest.approx(1.0, abs=1e-3)
    assert result["bottleneck"] in result["step_phases"]
    went = [line for line in lines if line.startswith("where the step time went: ")]
    assert len(went) == 1 and SHARES.search(went[0])
    assert [line for line in lines if line.startswith(f"advice: {result['bottleneck']}-bound")]
    exported = {m.group(1): float(m.group(2)) for m in re.finditer(
        r'towers_step_phase_seconds_total\{[^}]*phase="(\w+)"[^}]*\} (\S+)', text)}
    assert set(exported) == {"input", "compute", "exchange", "apply"}
    step_sum = float(re.search(r"towers_step_seconds_sum\{[^}]*\} (\S+)", text).group(1))
    # The phases divide each step's run time: together they are the steps' time. The
    # metrics' timer also spans the hooks between the two (reading a traced step's
    # statistics among them), a visible share of this model's ~3 ms steps.
    assert sum(exported.values()) == pytest.approx(step_sum, rel=0.25)
    assert re.search(r'towers_step_phase_seconds_total\{[^}]*job="train"', text)


def test_transfers_a_remote_master_records_are_exchange():
    step = stats(("ps:0", "RecvTensor", "", 0, 40), ("w:0", "tower_0/m/MatMul", "MatMul", 40, 100))
    step.dev_stats[0].node_stats[0].timeline_label = "RecvTensor"  # no ' = op(...)'
    assert split_step(step)["exchange"] == pytest.approx(0.4)


def test_samples_that_cost_more_are_taken_less_often(monkeypatch):
    import launch.runtime.step_phases as step_phases

    monkeypatch.setattr(step_phases, "SAMPLE_BUDGET", 1e-6)  # any sample is too dear
    sampled = []

    class Counted(StepPhases):
        def add(self, run_seconds, shares=None):
            sampled.append(bool(shares))
            super().add(run_seconds, shares)

    with tf.Graph().as_default():
        dataset = tf.data.Dataset.from_tensors((tf.zeros([8, 4]), tf.zeros([8], tf.int32)))
        features, labels = V1.data.make_one_shot_iterator(dataset.repeat()).get_next()
        ops = towers.build_train_op(tiny_classifier, features, labels, momentum(), ["/cpu:0"])
        with V1.train.MonitoredTrainingSession(hooks=[StepPhaseHook(Counted(), 0.0)]) as sess:
            for _ in range(20):
                sess.run(ops.train_op)
    assert sampled.index(True) == 1 and sum(sampled) == 1  # the second run; the next is far off
