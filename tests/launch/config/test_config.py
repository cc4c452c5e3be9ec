"""launch.config: job files parsed and validated once into frozen dataclasses."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path
from types import MappingProxyType

import pytest
import yaml

from launch.config import (
    ConfigError,
    JobConfig,
    dump_yaml,
    from_dict,
    load_job,
    to_dict,
)

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

# The schema's documented defaults, verbatim: JobConfig() must resolve to exactly this.
DOCUMENTED_DEFAULTS = """
run: {name: default}
model: {name: convnet, path: null}
data:
  source: builtin
  path: null
  eval_path: null
  label_column: label
  feature_columns: null
  num_classes: null
  shuffle_buffer: 10000
  num_parallel_calls: auto
  prefetch: auto
  threads: auto
  num_examples: 20000
  seed: 0
  schema: null
  image:
    augment: true
    crop_area: [0.08, 1.0]
    aspect_ratio: [0.75, 1.3333333333333333]
    flip: true
    eval_crop: 0.875
    mean: null
    std: null
  on_bad_record: fail
  epochs: null
towers:
  devices: auto
  variable_update: parameter_server
  param_device: cpu
  precision: float32
  gradient_dtype: float32
  xla: false
  pack_gradients_bytes: 4194304
  loss_scale: {initial: 32768.0, growth_steps: 2000}
  batch_norm: local
optimizer:
  name: momentum
  learning_rate: 0.05
  momentum: 0.9
  beta1: 0.9
  beta2: 0.999
  epsilon: 1.0e-7
  decay: 0.9
  clip_norm: null
  warmup_steps: 0
  reference_batch_size: null
  schedule:
    name: constant
    boundaries: []
    values: []
    decay_steps: 1000
    decay_rate: 0.96
    staircase: false
    alpha: 0.0
train:
  steps: 600
  batch_size: 256
  accumulate_steps: 1
  log_every_steps: 100
  summary_every_steps: 100
  checkpoint_every_steps: 500
  checkpoint_every_secs: null
  max_to_keep: 5
  keep_checkpoint_every_n_hours: 10000.0
  checkpoint_dir: runs/default
  histograms: false
  warm_start: null
  seed: 0
  sync: false
  backup_workers: 0
  on_nonfinite: stop
  max_nonfinite_steps: 10
  moving_average_decay: null
  phase_sample_secs: 1.0
  stall_warning_secs: 60.0
  stall_abort_secs: null
  stop_timeout_secs: 20.0
  straggler_ratio: 1.5
  straggler_steps: 50
  straggler_min_secs: 0.02
  timeline: null
  timeline_steps: [5, 15]
  profile_steps: null
eval:
  steps: null
  batch_size: 256
  every_secs: 30
  precision: float32
session:
  allow_growth: true
  per_process_gpu_memory_fraction: null
  allow_soft_placement: true
  log_device_placement: false
  visible_devices: null
  inter_op_threads: 0
  intra_op_threads: 0
metrics:
  port: null
  addr: 127.0.0.1
  certfile: null
  keyfile: null
cluster:
  backend: auto
  ps: []
  worker: []
  chief: []
  evaluator: []
  ps_per_node: 0
  port_base: null
  startup_timeout_secs: 120.0
  operation_timeout_secs: 300.0
  shutdown_grace_secs: 30.0
  reconnect_timeout_secs: 120.0
"""

# Every key set to something other than its default.
FULL = """
run:
  name: full
model:
  name: mlp
  input_dim: 784
  hidden_units: [64, 32]
  dropout: 0.1
data:
  source: csv
  path: [train-*.csv, extra.csv]
  eval_path: eval.csv
  label_column: target
  feature_columns: [b, a]
  num_classes: 3
  shuffle_buffer: 0
  num_parallel_calls: 4
  prefetch: 2
  num_examples: 100
  seed: 7
towers:
  devices: ["/cpu:0", "/cpu:1"]
  variable_update: replicated
  param_device: /cpu:0
optimizer:
  name: adam
  learning_rate: 1
  momentum: 0.5
  beta1: 0.8
  beta2: 0.99
  epsilon: 1e-8
  decay: 0.95
  clip_norm: 5
  warmup_steps: 10
  schedule:
    name: piecewise
    boundaries: [100, 200]
    values: [0.1, 0.01, 0.001]
    decay_steps: 50
    decay_rate: 0.5
    staircase: true
    alpha: 0.1
train:
  steps: 300
  batch_size: 64
  log_every_steps: 10
  summary_every_steps: 20
  checkpoint_every_steps: null
  checkpoint_every_secs: 60
  max_to_keep: 2
  keep_checkpoint_every_n_hours: 1
  checkpoint_dir: /tmp/full
  histograms: true
  warm_start:
    path: /ckpt/model.ckpt-100
    include: ["^dense"]
    exclude: [".*Momentum.*"]
    rename: {"new/": "old/"}
  seed: 3
eval:
  steps: 5
  batch_size: 32
  every_secs: 0.5
session:
  allow_growth: false
  per_process_gpu_memory_fraction: 0.5
  allow_soft_placement: false
  log_device_placement: true
  visible_devices: "0, 1"
  inter_op_threads: 2
  intra_op_threads: 4
metrics:
  port: 0
  addr: 0.0.0.0
  certfile: cert.pem
  keyfile: key.pem
"""


def write(tmp_path: Path, text: str | bytes, name: str = "job.yaml") -> str:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return str(path)


def raises_config_error(path: str | None, overrides=(), **kwargs) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_job(path, overrides, **kwargs)
    assert "\n" not in str(info.value)
    return info.value


# --- defaults -----------------------------------------------------------------------------


def test_no_file_is_the_built_in_default_job():
    assert load_job(None) == JobConfig()


def test_defaults_are_the_documented_schema():
    assert to_dict(JobConfig()) == yaml.safe_load(DOCUMENTED_DEFAULTS)


@pytest.mark.parametrize("text", ["", "# only a comment\n", "train:\nrun: null\n"])
def test_empty_file_or_sections_give_defaults(tmp_path, text):
    assert load_job(write(tmp_path, text)) == JobConfig()


def test_configs_are_frozen():
    job = load_job(None, ["model.hidden_units=[1]"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.train.steps = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        job.model.params["hidden_units"] = (2,)  # type: ignore[index]


def test_the_job_docstring_names_every_section():
    from launch.config import job as schema

    for section in dataclasses.fields(JobConfig):
        assert f"``{section.name}``" in schema.__doc__


def test_variable_update_accepts_the_towers_modes():
    # config spells the list out rather than importing towers (and with it TensorFlow).
    import towers

    modes = towers.VARIABLE_UPDATES
    for mode in modes:
        job = load_job(None, [f"towers.variable_update={mode}"])
        assert job.towers.variable_update == mode
    error = raises_config_error(None, ["towers.variable_update=mirrored"])
    assert f"accepted: {', '.join(sorted(modes))}" in error.message


def test_horovod_as_a_variable_update_is_read_as_the_backend_and_told_once(capsys):
    """towers.variable_update: horovod, the old spelling, is cluster.backend: horovod;
    the towers inside each rank share as parameter_server, as they did."""
    job = load_job(None, ["towers.variable_update=horovod"])
    assert (job.cluster.backend, job.towers.variable_update) == ("horovod", "parameter_server")
    notes = capsys.readouterr().err.splitlines()
    assert len(notes) == 1 and "is now spelled cluster.backend: horovod" in notes[0]
    error = raises_config_error(None, ["towers.variable_update=horovod",
                                       "cluster.backend=ps_worker"])
    assert (error.source, error.key) == ("--set", "cluster.backend")
    assert "the old spelling of cluster.backend: horovod" in error.message


def test_precisions_and_gradient_types_are_the_towers_ones():
    import towers
    from launch.config.training import BATCH_NORMS, GRADIENT_DTYPES, PRECISIONS

    assert PRECISIONS == towers.PRECISIONS and GRADIENT_DTYPES == towers.GRADIENT_DTYPES
    assert BATCH_NORMS == towers.BATCH_NORMS


@pytest.mark.parametrize("overrides, key, message", [
    (["towers.precision=float8"], "towers.precision", "accepted: float32, mixed_bfloat16"),
    (["towers.loss_scale.initial=1024"], "towers.loss_scale",
     "only used with towers.precision: mixed_float16; precision is 'float32'"),
    (["train.accumulate_steps=0"], "train.accumulate_steps", "must be > 0"),
    (["towers.precision=mixed_float16", "train.sync=true"], "towers.precision",
     "not available with train.sync"),
    (["optimizer.reference_batch_size=0"], "optimizer.reference_batch_size", "must be > 0"),
])
def test_precision_and_accumulation_keys_are_checked(overrides, key, message):
    error = raises_config_error(None, overrides)
    assert error.key == key and message in error.message, error


def test_validate_notes_the_micro_batch_and_the_scaled_rate_as_comments():
    from launch.config import derived_comments, dump_yaml

    job = load_job(None, ["train.batch_size=1024", "train.accumulate_steps=4",
                          "optimizer.learning_rate=0.05", "optimizer.reference_batch_size=256"])
    notes = derived_comments(job)
    assert "4 micro-batches of about 256 examples" in notes
    assert "learning_rate 0.05 becomes 0.2" in notes
    assert yaml.safe_load(dump_yaml(job) + notes) == to_dict(job)  # still the job file
    assert derived_comments(JobConfig()) == ""


def test_a_loss_scale_goes_with_mixed_float16():
    job = load_job(None, ["towers.precision=mixed_float16", "towers.loss_scale.initial=1024"])
    assert job.towers.loss_scale.initial == 1024.0 and job.towers.loss_scale.growth_steps == 2000


# --- a full file --------------------------------------------------------------------------


def test_full_file_normalises_values(tmp_path):
    job = load_job(write(tmp_path, FULL))
    assert job.model.name == "mlp"
    assert isinstance(job.model.params, MappingProxyType)
    assert dict(job.model.params) == {"input_dim": 784, "hidden_units": (64, 32), "dropout": 0.1}
    assert job.data.path == ("train-*.csv", "extra.csv")
    assert job.data.eval_path == ("eval.csv",)
    assert job.towers.devices == ("/cpu:0", "/cpu:1")
    assert job.optimizer.learning_rate == 1.0 and isinstance(job.optimizer.learning_rate, float)
    assert job.optimizer.epsilon == 1e-8
    assert job.optimizer.schedule.boundaries == (100, 200)
    assert job.train.checkpoint_every_secs == 60.0
    assert job.train.warm_start is not None
    assert job.train.warm_start.rename == {"new/": "old/"}
    assert job.session.visible_devices == "0,1"


def test_full_file_round_trips_through_to_dict_and_dump_yaml(tmp_path):
    job = load_job(write(tmp_path, FULL))
    assert load_job(write(tmp_path, dump_yaml(job), "dumped.yaml")) == job
    assert from_dict(to_dict(job)) == job
    assert to_dict(job)["data"]["path"] == ["train-*.csv", "extra.csv"]


def test_dump_yaml_quotes_strings_that_look_like_numbers():
    job = load_job(None, ["run.name='1e3'", "train.checkpoint_dir='007'"])
    assert yaml.safe_load(dump_yaml(job))["run"]["name"] == "1e3"
    assert from_dict(yaml.safe_load(dump_yaml(job))) == job


# --- overrides ----------------------------------------------------------------------------

OVERRIDES = [
    (["train.steps=100"], lambda j: j.train.steps, 100),
    (["train.steps=1", "train.steps=2"], lambda j: j.train.steps, 2),
    ([" train.steps = 7"], lambda j: j.train.steps, 7),
    (["towers.devices=[/cpu:0,/cpu:1]"], lambda j: j.towers.devices, ("/cpu:0", "/cpu:1")),
    (["towers.devices=/gpu:1"], lambda j: j.towers.devices, ("/gpu:1",)),
    (["towers.devices=2"], lambda j: j.towers.devices, 2),
    (["model.hidden_units=[64,64]"], lambda j: j.model.params["hidden_units"], (64, 64)),
    (["model.name=mlp"], lambda j: j.model.name, "mlp"),
    (["optimizer.epsilon=1e-8"], lambda j: j.optimizer.epsilon, 1e-8),
    (["optimizer.schedule.name=cosine"], lambda j: j.optimizer.schedule.name, "cosine"),
    (["train.warm_start.path=ckpt"], lambda j: j.train.warm_start.path, "ckpt"),
    (["train.warm_start=ckpt"], lambda j: j.train.warm_start.include, ()),
    (["data.source=npz", "data.path=a.npz"], lambda j: j.data.path, ("a.npz",)),
    (["session.visible_devices=[1, 0]"], lambda j: j.session.visible_devices, "1,0"),
    (["metrics.port=0"], lambda j: j.metrics.port, 0),
    (["train={steps: 9}"], lambda j: j.train.steps, 9),
]


@pytest.mark.parametrize("overrides, get, expected", OVERRIDES)
def test_override(overrides, get, expected):
    assert get(load_job(None, overrides)) == expected


def test_override_wins_over_file(tmp_path):
    path = write(tmp_path, "train: {steps: 5, batch_size: 8}\n")
    job = load_job(path, ["train.steps=6"])
    assert (job.train.steps, job.train.batch_size) == (6, 8)


def test_checkpoint_secs_alone_turns_off_the_steps_default():
    train = load_job(None, ["train.checkpoint_every_secs=60"]).train
    assert (train.checkpoint_every_steps, train.checkpoint_every_secs) == (None, 60.0)


def test_skipping_nonfinite_steps_is_refused_in_sync_mode():
    error = raises_config_error(None, ["train.on_nonfinite=skip", "train.sync=true"])
    assert "train.on_nonfinite" in str(error) and "train.sync" in str(error)


@pytest.mark.parametrize("override", ["train.steps", "=5", ".steps=1", "train..steps=1", " =1"])
def test_malformed_override(override):
    error = raises_config_error(None, [override])
    assert error.source == "--set"
    assert "malformed override" in str(error) and repr(override) in str(error)


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["train.steps=0"], "train.steps"),
        (["train.stpes=5"], "train.stpes"),
        (["train.steps=[1"], "train.steps"),  # the value is not YAML
        (["train.steps=5", "train.steps.x=1"], "train.steps.x"),  # descend into a scalar
        (["data.source=csv"], "data.path"),  # the missing key is the file's, the cause --set's
        (["train.warm_start.include=[a]"], "train.warm_start.path"),
    ],
)
def test_override_errors_name_set(tmp_path, overrides, key):
    error = raises_config_error(write(tmp_path, "train: {steps: 5}\n"), overrides)
    assert (error.source, error.key) == ("--set", key)
    assert str(error).startswith(f"--set: {key}: ")


def test_file_errors_name_the_file_despite_overrides(tmp_path):
    path = write(tmp_path, "train: {steps: 0}\n")
    error = raises_config_error(path, ["train.batch_size=8"])
    assert (error.source, error.key) == (path, "train.steps")


# --- bad values ---------------------------------------------------------------------------

BAD = [
    ("optimizer: {name: adm}", "optimizer.name", "did you mean 'adam'"),
    ("optimizer: {name: 3}", "optimizer.name", "expected one of adam, momentum"),
    ("train: {stpes: 5}", "train.stpes", "did you mean 'steps'"),
    ("trian: {}", "trian", "unknown section"),
    ("train: {steps: 0}", "train.steps", "must be > 0, got 0"),
    ("train: {steps: -5}", "train.steps", "must be > 0"),
    ("train: {steps: true}", "train.steps", "expected an integer, got bool True"),
    ("train: {steps: 10.5}", "train.steps", "expected an integer, got float 10.5"),
    ("train: {batch_size: '256'}", "train.batch_size", "expected an integer, got str '256'"),
    ("train: {max_to_keep: 0}", "train.max_to_keep", "must be > 0"),
    ("train: 5", "train", "expected a mapping of keys, got int 5"),
    ("train: {checkpoint_every_steps: 100, checkpoint_every_secs: 60}",
     "train.checkpoint_every_secs", "at most one of"),
    ("train: {checkpoint_every_secs: 0}", "train.checkpoint_every_secs", "must be > 0"),
    ("train: {checkpoint_dir: ''}", "train.checkpoint_dir", "must not be empty"),
    ("train: {warm_start: {include: [a]}}", "train.warm_start.path", "required"),
    ("train: {warm_start: {path: c, include: ['(']}}", "train.warm_start.include",
     "invalid regular expression"),
    ("train: {warm_start: {path: c, pathh: d}}", "train.warm_start.pathh", "did you mean 'path'"),
    ("train: {warm_start: {path: c, rename: [a]}}", "train.warm_start.rename",
     "expected a mapping"),
    ("optimizer: {learning_rate: 0}", "optimizer.learning_rate", "must be > 0"),
    ("optimizer: {learning_rate: fast}", "optimizer.learning_rate", "expected a number, got str"),
    ("optimizer: {momentum: 1.0}", "optimizer.momentum", "must be in [0, 1), got 1.0"),
    ("optimizer: {epsilon: .nan}", "optimizer.epsilon", "finite"),
    ("optimizer: {clip_norm: -1}", "optimizer.clip_norm", "must be > 0"),
    ("optimizer: {warmup_steps: -1}", "optimizer.warmup_steps", "must be >= 0"),
    ("optimizer: {schedule: {name: step}}", "optimizer.schedule.name",
     "accepted: constant, cosine"),
    ("optimizer: {schedule: {name: piecewise, boundaries: [10], values: [0.1]}}",
     "optimizer.schedule.values", "len(boundaries) + 1 = 2 values, got 1"),
    ("optimizer: {schedule: {name: piecewise, boundaries: [10, 10], values: [1, 2, 3]}}",
     "optimizer.schedule.boundaries", "strictly increasing"),
    ("optimizer: {schedule: {name: piecewise, boundaries: [a], values: [1, 2]}}",
     "optimizer.schedule.boundaries", "item 0: expected an integer"),
    ("optimizer: {schedule: {boundaries: [10], values: [1, 2]}}",
     "optimizer.schedule.boundaries", "only used by the piecewise schedule"),
    ("optimizer: {schedule: {alpha: 2}}", "optimizer.schedule.alpha", "in [0, 1]"),
    ("data: {source: parquet}", "data.source", "accepted: builtin, csv, npz, synthetic, tfrecord"),
    ("data: {source: csv}", "data.path", "required when data.source is 'csv'"),
    ("data: {source: npz, path: []}", "data.path", "must not be an empty list"),
    ("data: {source: tfrecord, path: [a, 3]}", "data.path", "item 1: expected a string"),
    ("data: {path: x.npz}", "data.path", "only used when data.source is one of"),
    ("data: {eval_path: x.npz}", "data.eval_path", "only used when data.source is one of"),
    ("data: {shuffle_buffer: -1}", "data.shuffle_buffer", "must be >= 0"),
    ("data: {prefetch: 0}", "data.prefetch", "expected 'auto' or a positive integer"),
    ("data: {num_parallel_calls: fast}", "data.num_parallel_calls", "expected 'auto' or"),
    ("data: {num_examples: 0}", "data.num_examples", "must be > 0"),
    ("data: {epochs: 0}", "data.epochs", "must be > 0"),
    ("data: {source: npz, path: x.npz, feature_columns: [a]}", "data.feature_columns",
     "only used when data.source is 'csv'"),
    ("data: {source: csv, path: x.csv, feature_columns: [a, a]}", "data.feature_columns",
     "repeated: a"),
    ("data: {source: csv, path: x.csv, feature_columns: []}", "data.feature_columns",
     "must not be an empty list"),
    ("data: {source: csv, path: x.csv, feature_columns: [a, label]}", "data.feature_columns",
     "names the label column 'label'"),
    ("data: {source: tfrecord, path: x, num_classes: 3}", "data.num_classes",
     "data.schema.num_classes"),
    ("data: {source: csv, path: x.csv, num_classes: 0}", "data.num_classes", "must be > 0"),
    ("towers: {variable_update: horovod, gradient_dtype: bfloat16}", "towers.gradient_dtype",
     "Horovod has no bfloat16 all-reduce"),
    ("towers: {devices: 0}", "towers.devices", "must be > 0"),
    ("towers: {devices: [gpu0]}", "towers.devices", "expected a device string"),
    ("towers: {devices: ['/gpu:0', '/gpu:0']}", "towers.devices", "repeated: /gpu:0"),
    ("towers: {devices: []}", "towers.devices", "must not be an empty list"),
    ("towers: {devices: 1.5}", "towers.devices", "expected 'auto', a positive device count"),
    ("towers: {variable_update: mirrored}", "towers.variable_update",
     "accepted: parameter_server, replicated"),
    ("towers: {param_device: gpu1}", "towers.param_device", "did you mean 'gpu'"),
    ("session: {per_process_gpu_memory_fraction: 1.5}",
     "session.per_process_gpu_memory_fraction", "must be in (0, 1]"),
    ("session: {visible_devices: gpu0}", "session.visible_devices", "comma-separated"),
    ("session: {visible_devices: '0,0'}", "session.visible_devices", "repeated: 0"),
    ("session: {allow_growth: 'yes'}", "session.allow_growth", "expected true or false"),
    ("session: {inter_op_threads: -1}", "session.inter_op_threads", "must be >= 0"),
    ("metrics: {certfile: c.pem}", "metrics.keyfile", "required when metrics.certfile is set"),
    ("metrics: {keyfile: k.pem}", "metrics.certfile", "required when metrics.keyfile is set"),
    ("metrics: {port: 70000}", "metrics.port", "must be in [0, 65535]"),
    ("eval: {every_secs: 0}", "eval.every_secs", "must be > 0"),
    ("cluster: {ps_per_node: -1}", "cluster.ps_per_node", "must be >= 0"),
    ("cluster: {port_base: 0}", "cluster.port_base", "must be in (0, 65535]"),
    ("run: {name: 5}", "run.name", "expected a string, got int 5"),
    ("model: [mlp]", "model", "expected a mapping"),
    ("model: {name: ''}", "model.name", "must not be empty"),
    ("model: {name: mlp, hidden-units: [1]}", "model.hidden-units", "must be identifiers"),
]


@pytest.mark.parametrize("text, key, fragment", BAD, ids=[case[1] for case in BAD])
def test_bad_value_names_file_and_key(tmp_path, text, key, fragment):
    path = write(tmp_path, text + "\n")
    error = raises_config_error(path)
    assert (error.source, error.key) == (path, key)
    assert str(error).startswith(f"{path}: {key}: ")
    assert fragment in error.message


# --- the file itself ----------------------------------------------------------------------

FILE_ERRORS = [
    ("train: {steps: 5\n", "invalid YAML at line 2"),
    ("train:\n  steps: 5\n bad: 1\n", "invalid YAML at line 3"),
    ("- run\n- train\n", "top level must be a mapping of sections"),
    ("just text\n", "top level must be a mapping"),
    ("run: {}\n---\ntrain: {}\n", "invalid YAML"),
    (b"run: {name: \xff}\n", "not UTF-8"),
]


@pytest.mark.parametrize("text, fragment", FILE_ERRORS)
def test_bad_file_names_the_file(tmp_path, text, fragment):
    path = write(tmp_path, text)
    error = raises_config_error(path)
    assert (error.source, error.key) == (path, "")
    assert str(error).startswith(f"{path}: ") and fragment in str(error)


@pytest.mark.parametrize("name, fragment", [("missing.yaml", "no such file"), ("", "directory")])
def test_unreadable_path_names_the_path(tmp_path, name, fragment):
    path = str(tmp_path / name) if name else str(tmp_path)
    error = raises_config_error(path)
    assert error.source == path and fragment in str(error)


def test_top_level_error_wins_over_overrides(tmp_path):
    path = write(tmp_path, "- a\n")
    assert raises_config_error(path, ["train.steps=1"]).source == path


# --- duplicate keys -----------------------------------------------------------------------

DUPLICATES = [
    ("train:\n  steps: 5\n  steps: 6\n", "train.steps", "line 3 (first on line 2)"),
    ("train: {}\nrun: {}\ntrain: {}\n", "train", "line 3 (first on line 1)"),
    ("model:\n  name: mlp\n  opts: {a: 1, a: 2}\n", "model.opts.a", "line 3"),
]


@pytest.mark.parametrize("text, key, fragment", DUPLICATES)
def test_duplicate_keys(tmp_path, text, key, fragment):
    path = write(tmp_path, text)
    error = raises_config_error(path)
    assert (error.source, error.key) == (path, key)
    assert "duplicate key" in str(error) and fragment in str(error)


def test_duplicate_key_in_override_value():
    error = raises_config_error(None, ["model.opts={a: 1, a: 2}"])
    assert (error.source, error.key) == ("--set", "model.opts.a")


def test_merge_keys_are_not_duplicates(tmp_path):
    text = "model:\n  base: &b {x: 1, y: 2}\n  other:\n    <<: *b\n    x: 3\n"
    job = load_job(write(tmp_path, text))
    assert dict(job.model.params["other"]) == {"x": 3, "y": 2}


# --- did you mean -------------------------------------------------------------------------

DID_YOU_MEAN = [
    ("optimzer: {}", "optimzer", "optimizer"),
    ("train: {batch_sise: 1}", "train.batch_sise", "batch_size"),
    ("optimizer: {name: rmsporp}", "optimizer.name", "rmsprop"),
    ("optimizer: {schedule: {name: cosin}}", "optimizer.schedule.name", "cosine"),
    ("data: {source: synthetc}", "data.source", "synthetic"),
    ("towers: {variable_update: replicate}", "towers.variable_update", "replicated"),
]


@pytest.mark.parametrize("text, key, suggestion", DID_YOU_MEAN)
def test_did_you_mean(tmp_path, text, key, suggestion):
    error = raises_config_error(write(tmp_path, text + "\n"))
    assert error.key == key
    assert str(error).endswith(f"(did you mean {suggestion!r}?)")


def test_no_suggestion_for_nothing_close(tmp_path):
    assert "did you mean" not in str(raises_config_error(write(tmp_path, "zzzzzz: 1\n")))


# --- check_model --------------------------------------------------------------------------


def test_check_model_gets_the_model_section_once(tmp_path):
    calls = []
    load_job(None, ["model.name=mlp", "model.hidden_units=[8]"],
             check_model=lambda model: calls.append((model.name, dict(model.params))))
    assert calls == [("mlp", {"hidden_units": (8,)})]


def test_model_path_and_the_job_files_directory_are_where_code_is_found(tmp_path):
    path = write(tmp_path, "model: {name: 'my_models.net:build', path: src, width: 3}\n")
    job = load_job(path)
    assert (job.model.name, job.model.path) == ("my_models.net:build", "src")
    assert dict(job.model.params) == {"width": 3}  # name and path are not parameters
    assert job.model.job_dir == str(tmp_path)
    assert load_job(None).model.job_dir is None
    assert "path: src" in dump_yaml(job)
    again = write(tmp_path, dump_yaml(job), "again.yaml")
    assert load_job(again) == job


@pytest.mark.parametrize("name", ["my.mod:", ":build", "my mod:build", "a:b:c", "1net", ""])
def test_model_name_must_be_a_name_or_module_colon_attribute(tmp_path, name):
    error = raises_config_error(write(tmp_path, f"model: {{name: '{name}'}}\n"))
    assert error.key == "model.name"


class ParamError(ValueError):
    param = "width"


MODEL_ERRORS = [
    (ValueError("parameter 'dropout' must be in [0, 1), got 2"), "model.dropout"),
    (ValueError("depth must be 6n+2"), "model"),
    (KeyError("unknown model 'mlpp'; known: convnet, mlp"), "model.name"),
    (ParamError("too wide"), "model.width"),
    (ConfigError("x", "model.dropout", "bad"), "model.dropout"),
]


@pytest.mark.parametrize("exc, key", MODEL_ERRORS)
def test_check_model_errors_become_config_errors(tmp_path, exc, key):
    def check_model(model):
        raise exc

    path = write(tmp_path, "model: {name: mlp, dropout: 2, width: 3}\n")
    error = raises_config_error(path, check_model=check_model)
    assert (error.source, error.key) == (path, key)
    assert error.__cause__ is exc


def test_check_model_error_from_override_names_set(tmp_path):
    def check_model(model):
        raise ValueError("parameter 'dropout' must be in [0, 1), got 2")

    error = raises_config_error(write(tmp_path, "model: {name: mlp}\n"), ["model.dropout=2"],
                                check_model=check_model)
    assert (error.source, error.key) == ("--set", "model.dropout")


def test_check_model_other_exceptions_propagate():
    def check_model(model):
        raise RuntimeError("bug in the registry")

    with pytest.raises(RuntimeError):
        load_job(None, check_model=check_model)


# --- ConfigError --------------------------------------------------------------------------


def test_config_error_is_a_one_line_value_error_that_pickles():
    error = ConfigError("job.yaml", "optimizer.name", "unknown value 'adm';\n accepted: adam")
    assert isinstance(error, ValueError)
    assert str(error) == "job.yaml: optimizer.name: unknown value 'adm'; accepted: adam"
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.source, copy.key, str(copy)) == (error.source, error.key, str(error))


# --- examples -----------------------------------------------------------------------------

EXAMPLE_FILES = sorted(EXAMPLES.glob("*.yaml"))


def test_there_is_an_example_per_model():
    names = {p.stem for p in EXAMPLE_FILES}
    assert {"convnet", "mlp", "resnet20", "resnet56", "lstm_lm"} <= names


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=[p.name for p in EXAMPLE_FILES])
def test_example_loads(path):
    assert path.read_text(encoding="utf-8").startswith("#"), "examples start with a comment"
    job = load_job(str(path))
    assert job.model.name == path.stem
