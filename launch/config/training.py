"""The sections that say how a job trains: towers, optimizer (with its schedule),
train (with warm start) and eval. Each dataclass is a section: every field holds its
check (``checks.checked_field``), and ``cross_check``, where a section has one, sees
the whole section once its fields are checked."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from launch.config.checks import (
    AUTO,
    MAX_SEED,
    Invalid,
    boolean,
    build,
    choice,
    device_count_or_list,
    named_or_device,
    number,
    optional,
    positive_int,
    prefix_map,
    regex,
    section_field,
    string,
    tuple_of,
)
from launch.config.checks import checked_field as _field  # short: every field below uses it

OPTIMIZERS = ("sgd", "momentum", "adam", "rmsprop")
SCHEDULES = ("constant", "piecewise", "exponential", "cosine")
# towers.VARIABLE_UPDATES, how the towers inside one process share gradients, not derived
# from it: importing towers imports TensorFlow, making this module ~20x slower to import,
# and `towers validate` would then print TensorFlow's start-up notices (cli imports it
# quietly, later). A test keeps them in step. (How processes are arranged, Horovod ranks
# among them, is cluster.backend: launch.config.arrangements.)
VARIABLE_UPDATES = ("parameter_server", "replicated")
# towers.PRECISIONS and towers.GRADIENT_DTYPES, spelled out for the same reason.
PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
GRADIENT_DTYPES = ("float32", "bfloat16", "float16")
PARAM_DEVICES = ("cpu", "gpu", "least_loaded")
# towers.BATCH_NORMS, spelled out for the same reason.
BATCH_NORMS = ("local", "sync")


def _warm_start(value: Any) -> WarmStartConfig:
    """train.warm_start: a mapping, or just the checkpoint path as a string."""
    return build(WarmStartConfig, {"path": value} if isinstance(value, str) else value)


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
    batch_norm: local (each tower normalizes by its own shard) or sync (by the whole
        global batch, across towers and Horovod ranks).
    """

    devices: str | int | tuple[str, ...] = _field(AUTO, device_count_or_list)
    variable_update: str = _field("parameter_server", choice(*VARIABLE_UPDATES))
    param_device: str = _field("cpu", named_or_device(*PARAM_DEVICES))
    precision: str = _field("float32", choice(*PRECISIONS))
    gradient_dtype: str = _field("float32", choice(*GRADIENT_DTYPES))
    xla: bool = _field(False, boolean)
    # Jobs without ps tasks: the workers' dense gradients travel in buffers of at most
    # this many bytes (towers.packed); 0 sends each tensor on its own. 4 MiB: resnet20's
    # 2-worker job ran 1.08x to 2.1x faster packed (BENCHMARKS.md). Where else packing
    # was measured, and why it applies nowhere else: towers.resolve_variable_update.
    pack_gradients_bytes: int = _field(4 * 2**20, number(int, ge=0))
    loss_scale: LossScaleConfig = section_field(LossScaleConfig)
    batch_norm: str = _field("local", choice(*BATCH_NORMS))

    @staticmethod
    def cross_check(values: dict[str, Any], raw: Mapping[str, Any]) -> None:
        if values["loss_scale"] != LossScaleConfig() and values["precision"] != "mixed_float16":
            raise Invalid(f"only used with towers.precision: mixed_float16; precision is "
                          f"{values['precision']!r}", "loss_scale", ["precision"])


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

    @staticmethod
    def cross_check(values: dict[str, Any], raw: Mapping[str, Any]) -> None:
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
    schedule: ScheduleConfig = section_field(ScheduleConfig)


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

    steps: int = _field(600, positive_int)
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
    seed: int = _field(0, number(int, ge=0, le=MAX_SEED))
    # ps/worker jobs only: synchronous updates aggregate one gradient from each of
    # (workers - backup_workers) workers per step; the slowest backups are dropped.
    sync: bool = _field(False, boolean)
    backup_workers: int = _field(0, number(int, ge=0))
    # A step whose loss or gradient is NaN or infinite is never applied: "stop" ends
    # the job (exit status 3), "skip" drops the update and goes on, ending the job
    # only after more than max_nonfinite_steps such steps in a row.
    on_nonfinite: str = _field("stop", choice("stop", "skip"))
    max_nonfinite_steps: int = _field(10, positive_int)
    # An exponential moving average of each trainable variable, kept beside it and in
    # checkpoints with this decay (e.g. 0.999); `towers eval --averages` and `towers
    # export --averages` use them. null: none.
    moving_average_decay: float | None = _field(None, optional(number(float, gt=0, lt=1)))
    # The least time between two steps traced for the step-phase shares (a sample that
    # costs more than 1% of it waits longer; 0: as often as that allows).
    phase_sample_secs: float = _field(1.0, number(float, ge=0))
    # No step finished for this long: say what the step waits for; for abort_secs:
    # end the process (exit status 138, retryable).
    stall_warning_secs: float = _field(60.0, number(float, gt=0))
    stall_abort_secs: float | None = _field(None, optional(number(float, gt=0)))
    # A stop signal whose step has not finished this long after it arrived ends the
    # process without a final checkpoint (exit status 138); None: wait for the step.
    stop_timeout_secs: float | None = _field(20.0, optional(number(float, gt=0)))
    # ps/worker, Horovod: a worker whose own time per step is straggler_ratio times the
    # others' median, and straggler_min_secs more, for straggler_steps of the chief's
    # steps (and a window of its own) is named by the chief.
    straggler_ratio: float = _field(1.5, number(float, gt=1))
    straggler_steps: int = _field(50, positive_int)
    straggler_min_secs: float = _field(0.02, number(float, ge=0))
    # A Chrome trace-event file of this process's session runs timeline_steps[0]..[1].
    timeline: str | None = _field(None, optional(string))
    timeline_steps: tuple[int, ...] = _field((5, 15), tuple_of(positive_int))
    # A TensorFlow profiler trace of these session runs ([first, last]; None: none).
    profile_steps: tuple[int, ...] | None = _field(None, optional(tuple_of(positive_int)))

    @staticmethod
    def cross_check(values: dict[str, Any], raw: Mapping[str, Any]) -> None:
        for key in ("timeline_steps", "profile_steps"):
            first_last = values[key]
            if first_last is not None and (len(first_last) != 2 or first_last[0] > first_last[1]):
                raise Invalid(f"must be [first, last] with first <= last, got "
                              f"{list(first_last)}", key)
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


@dataclass(frozen=True)
class EvalConfig:
    """eval: each evaluation scores every example of the evaluation data once, in batches
    of batch_size; steps, when set, stops it after that many batches. Generated data
    (synthetic, builtin) is scored on steps batches instead, 20 when steps is null.
    every_secs is the --watch interval. precision: what the towers compute in: float32,
    as the exported model does (its scores agree with the SavedModel's to 1e-5), or
    training, towers.precision (faster where 16 bits are; scores differ from the
    export's by 16-bit rounding, about 1e-3 in bfloat16)."""

    steps: int | None = _field(None, optional(positive_int))
    batch_size: int = _field(256, positive_int)
    every_secs: float = _field(30.0, number(float, gt=0))
    precision: str = _field("float32", choice("float32", "training"))
