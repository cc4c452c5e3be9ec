"""The job schema: one frozen dataclass per section, each field carrying its own check.

A job file has one section per field of ``JobConfig`` (``run``, ``model``, ``data``,
``towers``, ``optimizer``, ``train``, ``eval``, ``session``, ``metrics``, ``cluster``);
every section and key is optional, and ``JobConfig()`` is the built-in default job.

The dataclasses below are the schema: ``build_section`` rejects unknown keys, runs each
field's check (from ``launch.config.checks``, held in the field's metadata) and then the
section's cross-field check from ``_SECTION_CHECKS``.

Normalisation, so consumers see one shape per field:

* sequences become tuples (``data.path``, ``towers.devices`` as a list, schedule
  boundaries/values, warm-start include/exclude);
* ``data.path`` / ``data.eval_path`` are ``None`` or a non-empty tuple of strings (a single
  string becomes a 1-tuple);
* ``session.visible_devices`` is ``None`` or a string like ``"0,1"``;
* ints given for float fields become floats;
* ``model.params`` and ``warm_start.rename`` are read-only ``types.MappingProxyType``
  views; inside ``model.params`` lists become tuples and mappings become mapping proxies.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from launch.config.checks import (
    AUTO,
    CrossCheck,
    Invalid,
    auto_or,
    boolean,
    build,
    choice,
    describe,
    device_count_or_list,
    freeze,
    gpu_ids,
    host_port,
    named_or_device,
    number,
    optional,
    positive_int,
    prefix_map,
    regex,
    string,
    tuple_of,
    unique,
)
from launch.config.checks import checked_field as _field  # short: every field below uses it
from launch.config.data_schema import (
    ON_BAD_RECORD,
    ImageConfig,
    RecordSchemaConfig,
    image_section,
    record_schema,
)

DATA_SOURCES = ("synthetic", "builtin", "npz", "csv", "tfrecord")
FILE_SOURCES = ("npz", "csv", "tfrecord")
OPTIMIZERS = ("sgd", "momentum", "adam", "rmsprop")
SCHEDULES = ("constant", "piecewise", "exponential", "cosine")
# towers.VARIABLE_UPDATES plus "horovod", not derived from it: importing towers imports
# TensorFlow, making this module ~20x slower to import, and `towers validate` would then
# print TensorFlow's start-up notices (cli imports it quietly, later). A test keeps them in step.
VARIABLE_UPDATES = ("parameter_server", "replicated", "horovod")
# towers.PRECISIONS and towers.GRADIENT_DTYPES, spelled out for the same reason.
PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
GRADIENT_DTYPES = ("float32", "bfloat16", "float16")
PARAM_DEVICES = ("cpu", "gpu", "least_loaded")
DEFAULT_MODEL = "convnet"
_MAX_SEED = 2**31 - 1


# ---------------------------------------------------------------------------------------
# Fields: every field of a section holds its check (``checks.checked_field``).


def _section_field(cls: type) -> Any:
    """A field holding a whole nested section, built from a mapping (null means defaults)."""
    return field(default_factory=cls, metadata={"check": lambda value: build_section(cls, value)})


def _warm_start(value: Any) -> WarmStartConfig:
    """train.warm_start: a mapping, or just the checkpoint path as a string."""
    return build_section(WarmStartConfig, {"path": value} if isinstance(value, str) else value)


def model_name(value: Any) -> str:
    """model.name: a built-in or installed name, or `module.path:attribute`."""
    name = string(value)
    if ":" not in name:
        if not _DOTTED.fullmatch(name.replace("-", "_")):
            raise Invalid(f"expected a model name or module:attribute, got {name!r}")
        return name
    module, _, attribute = name.partition(":")
    if not (_DOTTED.fullmatch(module) and _DOTTED.fullmatch(attribute)):
        raise Invalid(
            f"expected module:attribute with a dotted module path and attribute, such as "
            f"my_models.net:build, got {name!r}"
        )
    return name


_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
_MODEL_KEYS = {"name": model_name, "path": string}  # the keys that are not parameters


def _model(value: Any) -> ModelConfig:
    """model: a name (and a code path) plus any model parameters as sibling keys."""
    if value is None:
        return ModelConfig()
    if not isinstance(value, dict):
        raise Invalid(f"expected a mapping with a name and model parameters, got "
                      f"{describe(value)}")
    params = {}
    for key, param in value.items():
        if not isinstance(key, str) or not key.isidentifier():
            raise Invalid(
                f"model parameter names must be identifiers, got {describe(key)}",
                key if isinstance(key, str) else "",
            )
        if key not in _MODEL_KEYS:
            params[key] = param
    checked = {}
    for key, check in _MODEL_KEYS.items():
        given = value.get(key, DEFAULT_MODEL if key == "name" else None)
        try:
            checked[key] = None if given is None else check(given)
        except Invalid as e:
            raise e.under(key) from None
    return ModelConfig(name=checked["name"], params=freeze(params), path=checked["path"])


# ---------------------------------------------------------------------------------------
# The sections. Field order is the order of to_dict / dump_yaml.


@dataclass(frozen=True)
class RunConfig:
    """run: name labels metrics and logs."""

    name: str = _field("default", string)


@dataclass(frozen=True)
class ModelConfig:
    """model: which model, where its code is, and every other key as a parameter.

    name: a built-in name, a name installed packages register (entry-point group
    ``towers.models``), or ``module.path:attribute`` of the user's own code.
    path: None or a directory searched for that code (after sys.path), relative to
    the working directory. params: a read-only ``types.MappingProxyType``; its lists
    are tuples and its mappings are mapping proxies. Resolving the name validates them
    (``load_job(check_model=...)``).
    job_dir: the job file's directory, also searched (set by ``load_job``; not a key).
    """

    name: str = DEFAULT_MODEL
    params: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    path: str | None = None
    job_dir: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class DataConfig:
    """data: where examples come from and how the input pipeline reads them.

    path / eval_path: None or a non-empty tuple of files or globs (npz, csv, tfrecord only).
    num_parallel_calls / prefetch: 'auto' (tf.data.AUTOTUNE) or a positive int.
    threads: the input pipeline's own pool of that many threads; 'auto' shares
    TensorFlow's inter-op pool.
    num_examples: examples generated by the builtin and synthetic sources.
    shuffle_buffer: records shuffled at a time (in-memory sources shuffle whole
    epochs); 0 keeps records in order.
    schema (tfrecord only) and image: see ``launch.config.data_schema``; without a
    schema a TFRecord holds ``features`` (floats, or ints for integer models) and
    ``label`` or ``labels``.
    on_bad_record: what a record that fails to parse or decode mid-run does (csv and
    tfrecord): fail the job (exit 2), or skip it, counted in the log and the metrics.
    epochs: None repeats the training data until train.steps; N reads it N times,
    then training ends (in a ps/worker job, when the first worker has read its shard
    N times).
    """

    source: str = _field("builtin", choice(*DATA_SOURCES))
    path: tuple[str, ...] | None = _field(None, optional(tuple_of(
        string, allow_single=True, non_empty=True)))
    eval_path: tuple[str, ...] | None = _field(None, optional(tuple_of(
        string, allow_single=True, non_empty=True)))
    label_column: str = _field("label", string)
    shuffle_buffer: int = _field(10000, number(int, ge=0))
    num_parallel_calls: int | str = _field(AUTO, auto_or(positive_int, "a positive integer"))
    prefetch: int | str = _field(AUTO, auto_or(positive_int, "a positive integer"))
    threads: int | str = _field(AUTO, auto_or(positive_int, "a positive integer"))
    num_examples: int = _field(20000, positive_int)
    seed: int = _field(0, number(int, ge=0, le=_MAX_SEED))
    schema: RecordSchemaConfig | None = _field(None, record_schema)
    image: ImageConfig = field(default_factory=ImageConfig, metadata={"check": image_section})
    on_bad_record: str = _field("fail", choice(*ON_BAD_RECORD))
    epochs: int | None = _field(None, optional(positive_int))


@dataclass(frozen=True)
class LossScaleConfig:
    """towers.loss_scale (mixed_float16): the scale starts at initial, halves on a step
    whose gradients overflow (that step is skipped) and doubles after growth_steps
    finite steps in a row."""

    initial: float = _field(32768.0, number(float, ge=1))
    growth_steps: int = _field(2000, positive_int)


@dataclass(frozen=True)
class TowersConfig:
    """towers: devices is 'auto', a positive count, or a tuple of device strings.

    precision: what the towers compute in (variables and checkpoints stay float32).
    gradient_dtype: what gradients travel in between devices and processes.
    xla: compile each tower with XLA.
    """

    devices: str | int | tuple[str, ...] = _field(AUTO, device_count_or_list)
    variable_update: str = _field("parameter_server", choice(*VARIABLE_UPDATES))
    param_device: str = _field("cpu", named_or_device(*PARAM_DEVICES))
    precision: str = _field("float32", choice(*PRECISIONS))
    gradient_dtype: str = _field("float32", choice(*GRADIENT_DTYPES))
    xla: bool = _field(False, boolean)
    loss_scale: LossScaleConfig = _section_field(LossScaleConfig)


@dataclass(frozen=True)
class ScheduleConfig:
    """optimizer.schedule: how the learning rate changes with the global step.

    piecewise: values[i] applies up to boundaries[i]; len(values) == len(boundaries) + 1,
    and the values replace optimizer.learning_rate.
    """

    name: str = _field("constant", choice(*SCHEDULES))
    boundaries: tuple[int, ...] = _field((), tuple_of(number(int, ge=0)))
    values: tuple[float, ...] = _field((), tuple_of(number(float, gt=0)))
    decay_steps: int = _field(1000, positive_int)
    decay_rate: float = _field(0.96, number(float, gt=0))
    staircase: bool = _field(False, boolean)
    alpha: float = _field(0.0, number(float, ge=0, le=1))


@dataclass(frozen=True)
class OptimizerConfig:
    """optimizer: momentum is used by momentum and rmsprop, beta1/beta2 by adam, decay by
    rmsprop; epsilon by adam and rmsprop. clip_norm is None or a global-norm limit."""

    name: str = _field("momentum", choice(*OPTIMIZERS))
    learning_rate: float = _field(0.05, number(float, gt=0))
    momentum: float = _field(0.9, number(float, ge=0, lt=1))
    beta1: float = _field(0.9, number(float, ge=0, lt=1))
    beta2: float = _field(0.999, number(float, ge=0, lt=1))
    epsilon: float = _field(1.0e-7, number(float, gt=0))
    decay: float = _field(0.9, number(float, ge=0, lt=1))
    clip_norm: float | None = _field(None, optional(number(float, gt=0)))
    warmup_steps: int = _field(0, number(int, ge=0))
    # The global batch learning_rate (and the schedule's values) are given for; the
    # rate used is scaled by train.batch_size / reference_batch_size (Goyal et al.'s
    # linear scaling). None: used as given.
    reference_batch_size: int | None = _field(None, optional(positive_int))
    schedule: ScheduleConfig = _section_field(ScheduleConfig)


@dataclass(frozen=True)
class WarmStartConfig:
    """train.warm_start: initialise variables from a checkpoint (file prefix or directory).

    include / exclude: regexes on variable names; empty include means every variable.
    rename: {old_prefix: new_prefix} from this graph's names to the checkpoint's.
    """

    path: str = _field(check=string)
    include: tuple[str, ...] = _field((), tuple_of(regex, allow_single=True))
    exclude: tuple[str, ...] = _field((), tuple_of(regex, allow_single=True))
    rename: Mapping[str, str] = field(
        default_factory=lambda: MappingProxyType({}), metadata={"check": prefix_map}
    )


@dataclass(frozen=True)
class TrainConfig:
    """train: steps is the global step to stop at; batch_size is the global batch.

    At most one of checkpoint_every_steps / checkpoint_every_secs is set; with neither,
    only the final checkpoint is written.
    """

    steps: int = _field(2000, positive_int)
    batch_size: int = _field(256, positive_int)
    # Each update runs the global batch as this many micro-batches, one after another,
    # summing their gradients: activations of batch_size / accumulate_steps at a time.
    accumulate_steps: int = _field(1, positive_int)
    log_every_steps: int = _field(100, positive_int)
    summary_every_steps: int = _field(100, positive_int)
    checkpoint_every_steps: int | None = _field(500, optional(positive_int))
    checkpoint_every_secs: float | None = _field(None, optional(number(float, gt=0)))
    max_to_keep: int = _field(5, positive_int)
    keep_checkpoint_every_n_hours: float = _field(10000.0, number(float, gt=0))
    checkpoint_dir: str = _field("runs/default", string)
    histograms: bool = _field(False, boolean)
    warm_start: WarmStartConfig | None = _field(None, optional(_warm_start))
    seed: int = _field(0, number(int, ge=0, le=_MAX_SEED))
    # ps/worker jobs only: synchronous updates aggregate one gradient from each of
    # (workers - backup_workers) workers per step; the slowest backups are dropped.
    sync: bool = _field(False, boolean)
    backup_workers: int = _field(0, number(int, ge=0))
    # A step whose loss or gradient is NaN or infinite is never applied: "stop" ends
    # the job (exit status 3), "skip" drops the update and goes on, ending the job
    # only after more than max_nonfinite_steps such steps in a row.
    on_nonfinite: str = _field("stop", choice("stop", "skip"))
    max_nonfinite_steps: int = _field(10, positive_int)


@dataclass(frozen=True)
class EvalConfig:
    """eval: steps batches of batch_size per evaluation; every_secs is the --watch interval."""

    steps: int = _field(20, positive_int)
    batch_size: int = _field(256, positive_int)
    every_secs: float = _field(30.0, number(float, gt=0))


@dataclass(frozen=True)
class SessionConfig:
    """session: the tf.compat.v1.ConfigProto settings.

    visible_devices: None or a string like '0,1' (gpu_options.visible_device_list).
    inter_op_threads / intra_op_threads: 0 lets TensorFlow choose.
    """

    allow_growth: bool = _field(True, boolean)
    per_process_gpu_memory_fraction: float | None = _field(
        None, optional(number(float, gt=0, le=1))
    )
    allow_soft_placement: bool = _field(True, boolean)
    log_device_placement: bool = _field(False, boolean)
    visible_devices: str | None = _field(None, optional(gpu_ids))
    inter_op_threads: int = _field(0, number(int, ge=0))
    intra_op_threads: int = _field(0, number(int, ge=0))


@dataclass(frozen=True)
class MetricsConfig:
    """metrics: port None is off, 0 picks a free port; certfile and keyfile go together."""

    port: int | None = _field(None, optional(number(int, ge=0, le=65535)))
    addr: str = _field("127.0.0.1", string)
    certfile: str | None = _field(None, optional(string))
    keyfile: str | None = _field(None, optional(string))


@dataclass(frozen=True)
class ClusterConfig:
    """cluster: ps/worker addresses for distributed jobs; all empty means in-process.

    chief: optional, at most one (as Kubeflow's TFJob writes it); without it worker 0
    is chief. evaluator: at most one; it runs no server. Timeouts bound every wait:
    startup for peers to come up, operation for a step (a dead peer becomes an
    error instead of a hang), shutdown grace for the last workers to report done,
    reconnect for a peer lost mid-job (a worker's ps tasks, a ps task's workers)
    to come back before the task gives up with exit status 138.
    """

    ps: tuple[str, ...] = _field((), unique(tuple_of(host_port)))
    worker: tuple[str, ...] = _field((), unique(tuple_of(host_port)))
    chief: tuple[str, ...] = _field((), tuple_of(host_port))
    evaluator: tuple[str, ...] = _field((), tuple_of(host_port))
    startup_timeout_secs: float = _field(120.0, number(float, gt=0))
    operation_timeout_secs: float = _field(300.0, number(float, gt=0))
    shutdown_grace_secs: float = _field(30.0, number(float, gt=0))
    reconnect_timeout_secs: float = _field(120.0, number(float, gt=0))


@dataclass(frozen=True)
class JobConfig:
    """A whole job; ``JobConfig()`` is the built-in default job."""

    run: RunConfig = _section_field(RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig, metadata={"check": _model})
    data: DataConfig = _section_field(DataConfig)
    towers: TowersConfig = _section_field(TowersConfig)
    optimizer: OptimizerConfig = _section_field(OptimizerConfig)
    train: TrainConfig = _section_field(TrainConfig)
    eval: EvalConfig = _section_field(EvalConfig)
    session: SessionConfig = _section_field(SessionConfig)
    metrics: MetricsConfig = _section_field(MetricsConfig)
    cluster: ClusterConfig = _section_field(ClusterConfig)


# ---------------------------------------------------------------------------------------
# Cross-field checks, one per section that needs one. Each gets the checked values (and may
# adjust them before the dataclass is made) and the raw mapping (to see what was given).


def _check_data(values: dict[str, Any], raw: Mapping[str, Any]) -> None:
    source = values["source"]
    if source in FILE_SOURCES and values["path"] is None:
        raise Invalid(f"required when data.source is {source!r}", "path", ["source"])
    if source not in FILE_SOURCES:
        for key in ("path", "eval_path"):
            if values[key] is not None:
                raise Invalid(
                    f"only used when data.source is one of {', '.join(FILE_SOURCES)}, but it "
                    f"is {source!r} (set data.source or remove {key})", key, ["source"],
                )
    if values["schema"] is not None and source != "tfrecord":
        raise Invalid(f"only used when data.source is 'tfrecord', but it is {source!r}",
                      "schema", ["source"])


def _check_schedule(values: dict[str, Any], raw: Mapping[str, Any]) -> None:
    boundaries, rates = values["boundaries"], values["values"]
    if values["name"] != "piecewise":
        for key in ("boundaries", "values"):
            if values[key]:
                raise Invalid(f"only used by the piecewise schedule; schedule is "
                              f"{values['name']!r}", key, ["name"])
        return
    for i in range(1, len(boundaries)):
        if boundaries[i] <= boundaries[i - 1]:
            raise Invalid(f"must be strictly increasing, got {list(boundaries)}", "boundaries")
    if len(rates) != len(boundaries) + 1:
        raise Invalid(
            f"piecewise needs len(boundaries) + 1 = {len(boundaries) + 1} values, "
            f"got {len(rates)}", "values", ["boundaries", "name"],
        )


def _check_train(values: dict[str, Any], raw: Mapping[str, Any]) -> None:
    if values["on_nonfinite"] == "skip" and values["sync"]:
        raise Invalid(
            "skip is not available with train.sync (every worker's gradient is awaited); "
            "use stop", "on_nonfinite", ["sync"],
        )
    if values["checkpoint_every_secs"] is None or values["checkpoint_every_steps"] is None:
        return
    if "checkpoint_every_steps" not in raw:
        values["checkpoint_every_steps"] = None  # choosing secs turns the steps default off
        return
    raise Invalid(
        "at most one of checkpoint_every_steps and checkpoint_every_secs may be set; "
        "set the other to null", "checkpoint_every_secs", ["checkpoint_every_steps"],
    )


def _check_metrics(values: dict[str, Any], raw: Mapping[str, Any]) -> None:
    if (values["certfile"] is None) != (values["keyfile"] is None):
        missing, given = ("keyfile", "certfile") if values["keyfile"] is None else (
            "certfile", "keyfile")
        raise Invalid(f"required when metrics.{given} is set (TLS needs both)", missing,
                      [given])


def _check_cluster(values: dict[str, Any], raw: Mapping[str, Any]) -> None:
    for key in ("chief", "evaluator"):
        if len(values[key]) > 1:
            raise Invalid(f"at most one address, got {len(values[key])}", key)
    addresses = [a for key in ("ps", "worker", "chief") for a in values[key]]
    repeated = sorted({a for a in addresses if addresses.count(a) > 1})
    if repeated:
        raise Invalid(f"address used by two tasks: {', '.join(repeated)}", "worker")
    if values["ps"] and not (values["worker"] or values["chief"]):
        raise Invalid("a cluster with ps tasks needs at least one worker", "worker")


def _check_towers(values: dict[str, Any], raw: Mapping[str, Any]) -> None:
    if values["loss_scale"] != LossScaleConfig() and values["precision"] != "mixed_float16":
        raise Invalid(f"only used with towers.precision: mixed_float16; precision is "
                      f"{values['precision']!r}", "loss_scale", ["precision"])


def _check_job(values: dict[str, Any], raw: Mapping[str, Any]) -> None:
    if values["data"].epochs is not None and values["towers"].variable_update == "horovod":
        raise Invalid(
            "not available with horovod: ranks whose data ran out at different steps would "
            "wait for each other for ever; leave it unset and use train.steps",
            "data.epochs", ["towers.variable_update"],
        )
    train = values["train"]
    if train.sync and values["towers"].precision == "mixed_float16":
        raise Invalid(
            "mixed_float16 is not available with train.sync (a step skipped for a "
            "loss-scale overflow cannot drop out of a synchronous step); use "
            "mixed_bfloat16", "towers.precision", ["train.sync"],
        )


_SECTION_CHECKS: dict[type, CrossCheck] = {
    DataConfig: _check_data,
    ScheduleConfig: _check_schedule,
    TrainConfig: _check_train,
    TowersConfig: _check_towers,
    MetricsConfig: _check_metrics,
    ClusterConfig: _check_cluster,
    JobConfig: _check_job,
}


def build_section(cls: type, raw: Any) -> Any:
    """Section ``cls`` (JobConfig: the whole job) from its raw mapping, fully checked."""
    what = "section" if cls is JobConfig else "key"
    return build(cls, raw, _SECTION_CHECKS.get(cls), what)
