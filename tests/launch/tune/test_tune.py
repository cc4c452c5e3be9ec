"""`towers tune`: the stages it tries, the tuned job file, and one whole search on a tiny
job. The figures themselves are never asserted: they depend on the machine and its load."""

import pytest
from helpers.commands import run_in_process

from launch.config import from_dict, load_job
from launch.tune import choices
from launch.tune.search import Measured, Outcome, TuneSettings
from launch.tune.written import default_path, tuned_text

TINY = """# a tiny job
model:
  name: mlp
  input_dim: 8
  hidden_units: [16]
  num_classes: 2
data:
  source: synthetic
  num_examples: 256
train:
  batch_size: 16
"""


def job(**sections):
    return from_dict({"model": {"name": "mlp"}, **sections})


def stage(stages, name):
    return next(s for s in stages if s.name == name)


def no_gain(number_type):
    return None


def test_the_number_types_are_tried_only_when_allowed():
    for allowed in (False, True):
        found = choices.stages(job(), 2, False, allowed, lambda number_type: 1.5)
        for name in ("precision", "gradient type"):
            if allowed:
                assert stage(found, name).not_tried is None
            else:
                assert stage(found, name).not_tried.startswith(
                    "changes results beyond rounding; --allow-precision tries it")
    precision = stage(choices.stages(job(), 2, False, True, lambda t: 1.5), "precision")
    assert precision.candidates == [{"towers.precision": "mixed_bfloat16"},
                                    {"towers.precision": "mixed_float16"}]


def test_a_16_bit_type_is_tried_only_where_the_kernels_run_faster_in_it():
    speeds = {"bfloat16": 1.6, "float16": 0.005}
    precision = stage(choices.stages(job(), 2, False, True, speeds.get), "precision")
    assert precision.candidates == [{"towers.precision": "mixed_bfloat16"}]
    slow = stage(choices.stages(job(), 2, False, True, lambda t: 0.1), "precision")
    assert slow.candidates == [] and "no faster in 16 bits" in slow.not_tried
    # A 16-bit job is offered float32 back.
    half = job(towers={"precision": "mixed_bfloat16"})
    assert stage(choices.stages(half, 2, False, True, no_gain), "precision").candidates == [
        {"towers.precision": "float32"}]


def test_sharing_candidates_are_the_other_ways_and_one_tower_has_none():
    sharing = stage(choices.stages(job(), 2, True, False, no_gain),
                    "variable update and parameter device")
    assert sharing.candidates == [
        {"towers.variable_update": "parameter_server", "towers.param_device": "gpu"},
        {"towers.variable_update": "parameter_server", "towers.param_device": "least_loaded"},
        {"towers.variable_update": "replicated"}]
    one = stage(choices.stages(job(), 1, False, False, no_gain),
                "variable update and parameter device")
    assert one.candidates == [] and one.not_tried == "one tower shares nothing"


def test_micro_batches_fewer_where_the_job_has_several_more_where_it_does_not_fit():
    accumulating = job(train={"accumulate_steps": 4, "batch_size": 64})
    assert stage(choices.stages(accumulating, 2, False, False, no_gain),
                 "micro-batches").candidates == [{"train.accumulate_steps": 1},
                                                 {"train.accumulate_steps": 2}]
    assert choices.for_memory(job(train={"batch_size": 16}), 2) == [
        {"train.accumulate_steps": 2}, {"train.accumulate_steps": 4},
        {"train.accumulate_steps": 8}]


def test_the_tuned_file_is_the_job_with_the_chosen_settings_and_says_why(tmp_path):
    original = tmp_path / "tiny.yaml"
    original.write_text(TINY)
    outcome = Outcome({"towers.xla": True},
                      [Measured("XLA", {}, 10.0, 1.0),
                       Measured("XLA", {"towers.xla": True}, 12.0, 1.2, chosen=True)],
                      {"XLA": "towers.xla=true: 1.20x the settings before"})
    settings = TuneSettings(str(original), ("train.steps=5",), 3, 2, 1, 900, 100)
    text = tuned_text(settings, outcome, "a machine", "today")
    (tmp_path / "tuned.yaml").write_text(text)
    assert load_job(str(tmp_path / "tuned.yaml")) == load_job(
        str(original), ["train.steps=5", "towers.xla=true"])
    assert "# | XLA | towers.xla=true | 12.0 | 1.200 | chosen |\n" in text
    assert "#   XLA: towers.xla=true: 1.20x the settings before\n" in text
    assert default_path(str(original)) == str(tmp_path / "tiny.tuned.yaml")
    assert default_path(None) == "tuned.yaml"


@pytest.mark.parametrize("args, message", [
    (["--steps", "0"], "--steps must be at least 1"),
    (["--set", "cluster.backend=horovod"], "cluster.backend: towers tune times the job's step "
     "in one process"),
])
def test_bad_options_exit_2_with_one_line(args, message):
    result = run_in_process("tune", *args)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("towers: error:")]
    assert len(errors) == 1 and message in errors[0], result.stderr[-2000:]


@pytest.mark.e2e
def test_a_search_on_a_tiny_job_writes_a_job_that_loads_with_its_choices(tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY)
    # The command in this process: each candidate's step is timed in a process of its own.
    result = run_in_process("tune", "-c", str(tmp_path / "tiny.yaml"), "--steps", "2",
                            "--repeats", "2", "--warmup", "1", "--budget", "200")
    assert result.returncode == 0, result.stderr[-3000:]
    text = (tmp_path / "tiny.tuned.yaml").read_text()
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("# | ")][2:]
    chosen = [row[2] for row in rows if row[-1] == "chosen |"]
    # Every stage tried keeps the settings before or takes one candidate.
    assert len(chosen) == len({row[1] for row in rows}) >= 2  # sharing and XLA
    changes = [c for c in chosen if c != "the settings before"]
    overrides = [part for change in changes for part in change.split(", ")]
    assert load_job(str(tmp_path / "tiny.tuned.yaml")) == load_job(
        str(tmp_path / "tiny.yaml"), overrides)
    assert "#   precision: not tried: changes results beyond rounding; --allow-precision " \
        "tries it\n" in text
    assert "| stage | setting | examples/sec |" in result.stdout
